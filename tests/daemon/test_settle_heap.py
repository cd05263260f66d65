"""The daemon hides start-up's objects from the garbage collector (daemon.settle_heap), so that a full collection
while serving walks only what was made since: a collection stops every request of the process for its length."""

import gc

from trimtab.daemon import settle_heap


def test_start_up_objects_leave_the_collector_s_sight_and_later_full_collections_walk_only_new_ones():
    gc.unfreeze()
    before_tracked = len(gc.get_objects())
    try:
        frozen = settle_heap()
        assert frozen == gc.get_freeze_count() and frozen > 0.5 * before_tracked
        made_since = [[i] for i in range(1000)]  # objects made after start-up are still collected
        assert len(gc.get_objects()) < 0.5 * before_tracked
        assert sum(1 for o in gc.get_objects() if o is made_since[0]) == 1
    finally:
        gc.unfreeze()
