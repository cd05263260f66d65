"""Sample time from the wall clock, order from the monotonic clock: a step of the wall clock moves the stamps with
it (never into the future), keeps (GPU, time) unique, and is recorded as a clock_step event on the node."""

from trimtab.agent.sampler import Sampler
from trimtab.contract.readings import EVENT_CLOCK_STEP
from tests.agent.test_sampler import ScriptedSource

HOUR_MS = 3_600_000
T0_MS = 1_800_000_000_000


class Clocks:
    """A wall clock that can be stepped and a monotonic one that cannot, both advanced together by ``tick``."""

    def __init__(self):
        self.mono_ms = 5_000
        self.wall_ms = T0_MS

    def advance(self, ms: int) -> None:
        self.mono_ms += ms
        self.wall_ms += ms

    def sampler(self) -> Sampler:
        return Sampler([ScriptedSource()], lambda b: None, hostname="n", clock_ms=lambda: self.wall_ms,
                       monotonic_ms=lambda: self.mono_ms)


def run(clocks: Clocks, sampler: Sampler, ticks: int, interval_ms: int = 1000):
    """(stamp, wall clock at the tick, events) of ``ticks`` ticks ``interval_ms`` apart."""
    out = []
    for _ in range(ticks):
        batch = sampler.tick()
        out.append((batch.gpu_samples[0].ts_ms, clocks.wall_ms, batch.events))
        clocks.advance(interval_ms)
    return out


def test_a_step_back_of_an_hour_stamps_the_wall_clock_never_the_future():
    clocks = Clocks()
    sampler = clocks.sampler()
    before = run(clocks, sampler, 30)
    clocks.wall_ms -= HOUR_MS
    after = run(clocks, sampler, 30)
    for stamp, wall, _ in after:
        assert wall <= stamp <= wall + 1, (stamp, wall)  # the wall clock now (1 ms at most to stay unique)
    step_events = [e for _, _, events in before + after for e in events if e.kind == EVENT_CLOCK_STEP]
    assert len(step_events) == 1
    assert step_events[0].ts_ms == after[0][0]
    assert "stepped back 3600.000 s" in step_events[0].detail


def test_a_step_back_by_whole_intervals_lands_on_issued_stamps_and_moves_them_on_by_1_ms():
    clocks = Clocks()
    sampler = clocks.sampler()
    before = run(clocks, sampler, 20)
    clocks.wall_ms -= 10_000  # ten ticks back: the next ten ticks land exactly on stamps already issued
    after = run(clocks, sampler, 20)
    stamps = [s for s, _, _ in before + after]
    assert len(set(stamps)) == len(stamps), "(GPU, time) stays unique: no sample taken for a duplicate"
    moved = [s - wall for s, wall, _ in after if s != wall]
    assert moved == [1] * 10, "only the ten that met an issued stamp, by 1 ms"
    (event,) = [e for _, _, events in after for e in events if e.kind == EVENT_CLOCK_STEP]
    assert f"times {after[0][0]}..{before[-1][0]}" in event.detail


def test_a_step_forward_is_just_a_step_forward():
    clocks = Clocks()
    sampler = clocks.sampler()
    run(clocks, sampler, 5)
    clocks.wall_ms += HOUR_MS
    after = run(clocks, sampler, 5)
    assert [s for s, _, _ in after] == [wall for _, wall, _ in after]
    (event,) = [e for _, _, events in after for e in events if e.kind == EVENT_CLOCK_STEP]
    assert "stepped forward 3600.000 s" in event.detail and "times" not in event.detail
    assert sampler.stats.clock_steps == 1


def test_slewing_and_tick_jitter_are_not_steps():
    clocks = Clocks()
    sampler = clocks.sampler()
    for jitter_ms in (0, 3, 1, 250, 0, 7):
        sampler.tick()
        clocks.advance(1000 + jitter_ms)
        clocks.wall_ms += 1  # an NTP slew of 1 ms a second is already twice the most NTP does
    assert sampler.stats.clock_steps == 0
