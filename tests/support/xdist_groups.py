"""How the suite spreads over pytest-xdist workers (``-n 2 --dist loadgroup`` in pyproject.toml).

Three kinds of tests must not simply be dealt out one by one:

* ``ray``: the verl tests share one local Ray (and TransferQueue) per process; two workers would start two, each
  with its own CPUs and actor processes, on a 2-core machine. They run as one group on one worker.
* a module whose tests share a module-scoped fixture (a TRL run, a Prometheus that has scraped, a PostgreSQL
  database): split over two workers it would be built twice. Such a module is one group.
* ``serial``: a test that times itself against a wall-clock bound (a sampler's tick grid, a lease's takeover, a
  CPU-time ratio) is marked ``@pytest.mark.serial``. ``SerialLastScheduling`` runs those after every other test,
  with the other workers shut down, so no neighbour's load is in what they measure; the bounds stay as they are.

``python3 -m pytest -n 0`` still runs everything in one process, as before.
"""

from __future__ import annotations

import types

import pytest

SERIAL = "serial"
RAY = "ray"
# Modules whose import means the test drives verl on the shared local Ray (tests/trainer/conftest.py ``verl_ray``).
RAY_MODULES = frozenset({"tests.trainer.verl_harness", "tests.trainer.verl_legacy_harness",
                         "tests.trainer.verl_v1_sync_harness", "tests.trainer.verl_async_harness"})


def _uses_ray(item: pytest.Item) -> bool:
    if "verl_ray" in getattr(item, "fixturenames", ()):
        return True
    module = getattr(item, "module", None)
    if module is None:
        return False
    for value in vars(module).values():
        origin = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if origin in RAY_MODULES:
            return True
    return False


def _module_scoped(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in ("module", "class", "package")
               for defs in info.name2fixturedefs.values())


def group_of(item: pytest.Item) -> str | None:
    """The xdist group an item must run in, or None where any worker may take it alone."""
    if item.get_closest_marker(SERIAL) is not None:
        return SERIAL
    if _uses_ray(item):
        return RAY
    if _module_scoped(item):
        return item.nodeid.split("::", 1)[0]
    return None


def add_groups(items: list[pytest.Item]) -> None:
    """Adds ``xdist_group(name)`` to the items that need one (before xdist reads the marks)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        name = group_of(item)
        if name is not None:
            item.add_marker(pytest.mark.xdist_group(name))


def make_scheduler(config, log):
    """``--dist loadgroup`` with the ``serial`` group held back until it can run alone (other --dist modes: None,
    so xdist uses its own)."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SerialLastScheduling(LoadGroupScheduling):
        """Load-group scheduling, except the ``serial`` unit: it is dealt last, once every other worker has
        finished what it was given (they are told to shut down, which lets each run its last test), to one
        worker alone."""

        waiting_node = None

        def _others_busy(self, node) -> bool:
            return any(self._pending_of(work) for other, work in self.assigned_work.items() if other is not node)

        def _assign_work_unit(self, node) -> None:
            if SERIAL in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end(SERIAL)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            if list(self.workqueue) != [SERIAL] or node.shutting_down:
                super()._reschedule(node)
                return
            if self.waiting_node is None:
                self.waiting_node = node
                for other in self.nodes:
                    if other is not node:
                        other.shutdown()
            self._serial_if_alone()

        def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
            super().mark_test_complete(node, item_index, duration)
            self._serial_if_alone()

        def _serial_if_alone(self) -> None:
            node = self.waiting_node
            if node is not None and self.workqueue and not self._others_busy(node):
                self._assign_work_unit(node)

    return SerialLastScheduling(config, log)
