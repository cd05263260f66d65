"""The live view follows a node whose clock stepped back (issue 39, item 4): `trimtab up`'s own agent on a machine
whose clock steps, and a server's ingest of batches that say when they were sent."""

from __future__ import annotations

from types import SimpleNamespace

from trimtab.api import live_view
from trimtab.api.live_view import LatestSnapshot
from trimtab.contract.readings import STEP_BACK_MARGIN_MS
from tests.store.conftest import make_batch

HOUR_MS = 3_600_000


class MachineClock:
    """This machine's clocks: the wall clock (which steps) and the monotonic clock (which does not)."""

    def __init__(self):
        self.mono_ms, self.offset_ms = 1_000_000, 1_800_000_000_000

    def advance(self, ms: int) -> None:
        self.mono_ms += ms

    def wall_ms(self) -> int:
        return self.mono_ms + self.offset_ms

    def module(self) -> SimpleNamespace:
        return SimpleNamespace(time=lambda: self.wall_ms() / 1000, time_ns=lambda: self.wall_ms() * 1_000_000,
                               monotonic_ns=lambda: self.mono_ms * 1_000_000)


def held(view: LatestSnapshot) -> tuple[set[int], set[int]]:
    (snap,) = view.nodes()
    return {s.ts_ms for s in snap.samples.values()}, {snap.host.ts_ms}


def test_trimtab_up_follows_its_own_clock_stepping_back_two_minutes(monkeypatch):
    """Two minutes: less than MAX_CLOCK_AHEAD_S, so the held reading is not "in the far future" by the stepped
    clock (that rule let a step past it through already)."""
    clock = MachineClock()
    monkeypatch.setattr(live_view, "time", clock.module())
    view = LatestSnapshot()
    for _ in range(3):
        view.update_sampled(make_batch([clock.wall_ms()]))
        clock.advance(1000)
    before = clock.wall_ms() - 1000
    clock.offset_ms -= 120_000  # the machine's clock steps back two minutes
    view.update_sampled(make_batch([clock.wall_ms()]))
    assert held(view) == ({before}, {before}), "within the margin: held"
    clock.advance(STEP_BACK_MARGIN_MS + 1000)
    now = clock.wall_ms()
    view.update_sampled(make_batch([now]))
    assert held(view) == ({now}, {now}), "the node's reading of now, GPUs and host"


def test_a_batch_without_sent_ms_keeps_the_stamp_rule(monkeypatch):
    clock = MachineClock()
    monkeypatch.setattr(live_view, "time", clock.module())
    view = LatestSnapshot()
    view.update(make_batch([clock.wall_ms()]))
    first = clock.wall_ms()
    clock.advance(STEP_BACK_MARGIN_MS * 10)
    view.update(make_batch([clock.wall_ms() - HOUR_MS]))
    assert held(view) == ({first}, {first})
