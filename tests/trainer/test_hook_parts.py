"""The hook's parts on their own: step and phase arithmetic, allocator statistics, knob declarations and the
report's wire form (exactly the API's fields)."""

from __future__ import annotations

import math
import time

import pytest

from trimtab.trainer import StepReport, attach
from trimtab.trainer.knobs import KnobSet
from trimtab.trainer.memory import MemorySampler


@pytest.mark.serial  # a wall-clock bound: under xdist it runs after the other tests, alone
def test_step_time_runs_from_boundary_to_boundary_and_other_is_what_the_phases_leave():
    hook = attach("parts")
    t0 = time.perf_counter()
    times = []
    for _ in range(3):
        with hook.phase("generation"):
            time.sleep(0.01)
        time.sleep(0.005)  # outside any phase: "other"
        hook.step_end()
        r = hook.last_report
        times.append(r.step_time_s)
        assert r.phases_s["generation"] >= 0.01 and r.phases_s["other"] >= 0.005
        assert math.isclose(r.phases_s["generation"] + r.phases_s["other"], r.step_time_s, rel_tol=1e-9)
    assert sum(times) == pytest.approx(time.perf_counter() - t0, abs=0.005)  # no gap, no overlap
    assert hook.step == 3 and hook.last_report.step == 2


def test_nested_phases_never_make_other_negative_and_unknown_phases_are_refused():
    hook = attach("parts")
    with hook.phase("update"):
        with hook.phase("communication"):
            time.sleep(0.004)
    hook.step_end(phases_s={"evaluation": 0.5})  # timed elsewhere (a framework's timers)
    assert hook.last_report.phases_s["other"] == 0.0 and hook.last_report.phases_s["evaluation"] == 0.5
    with pytest.raises(ValueError, match="unknown phase"):
        hook.phase("rollout")


def test_memory_statistics_give_fragmentation_and_deltas_at_most_every_few_seconds():
    stats = {"allocated_bytes.all.current": 60, "reserved_bytes.all.current": 80,
             "inactive_split_bytes.all.current": 8, "num_alloc_retries": 3, "num_ooms": 1}
    sampler = MemorySampler(every_s=5.0, stats_fn=lambda: dict(stats), enabled_fn=lambda: True)
    first = sampler.maybe_sample(100.0)
    assert first["fragmentation"] == pytest.approx(0.1) and first["cached_free_fraction"] == pytest.approx(0.25)
    assert first["alloc_retries_delta"] is None and first["num_alloc_retries"] == 3
    assert sampler.maybe_sample(104.9) is None  # ~150 µs a call on the H200: not every step
    stats.update({"num_alloc_retries": 5, "num_ooms": 1})
    later = sampler.maybe_sample(105.0)
    assert (later["alloc_retries_delta"], later["ooms_delta"]) == (2, 0)
    assert MemorySampler(enabled_fn=lambda: False).maybe_sample(0.0) is None  # CPU: omitted


def test_knob_declarations_keep_integers_integral_and_refuse_nonsense():
    knobs = KnobSet({"batch_size": (8, 1, 64), "kl_coef": {"value": 0.1, "min": 0.0, "max": 1.0}})
    assert knobs.declaration() == {"batch_size": {"value": 8, "min": 1, "max": 64},
                                   "kl_coef": {"value": 0.1, "min": 0.0, "max": 1.0}}
    assert knobs.check("batch_size", 16.0) == (16, None) and type(knobs.check("batch_size", 16.0)[0]) is int
    assert knobs.check("kl_coef", 1) == (1.0, None)
    for name, value, why in [("batch_size", math.nan, "finite"), ("batch_size", True, "finite"),
                             ("batch_size", 0, "outside"), ("lr", 1, "declared no knob")]:
        assert why in knobs.check(name, value)[1]
    with pytest.raises(ValueError, match="above max"):
        KnobSet({"prefetch": (0, 4, 0)})
    for bad in ({"job": "my job"}, {"knobs": {"batch size": (1, 1, 2)}}, {"device_map": {"actor/0": [0]}}):
        with pytest.raises(ValueError, match="letters, digits"):
            attach(**{"job": "ok", **bad})  # refused at attach, not by a 422 on every retry


def test_the_wire_form_is_exactly_the_apis_fields_and_never_sends_made_up_values():
    report = StepReport(step=3, rank=1, step_time_s=2.0, phases_s={"generation": 1.0, "update": math.nan},
                        samples=16, tokens=None, memory={"fragmentation": 0.2, "cached_free_fraction": 0.05,
                                                         "ooms_delta": 0, "num_ooms": 0},
                        collective_latency_us=42.0, component="actor", collective_baseline_us=30.0, local_gpu=0)
    assert report.to_wire() == {"step": 3, "rank": 1, "step_time_s": 2.0, "phases": {"generation": 1.0},
                                "samples": 16, "memory": {"fragmentation": 0.2, "num_ooms": 0},
                                "collective_latency_us": 42.0, "local_gpu": 0}
    assert report.samples_per_s == 8.0 and report.tokens_per_s is None


def test_logged_values_the_api_would_refuse_are_left_out_not_the_whole_report():
    from trimtab.trainer.step_record import StepReport

    logs = {"loss": 0.5, "lr": float("nan"), "epoch": 1, "flag": True, "bad\nname": 1.0, "x" * 129: 2.0,
            **{f"m{i:02d}": float(i) for i in range(70)}}
    wire = StepReport(step=1, rank=0, step_time_s=1.0, logged=logs, reward_mean=float("inf")).to_wire()
    assert len(wire["logged"]) == 64 and wire["logged"]["epoch"] == 1.0 and wire["logged"]["loss"] == 0.5
    assert not {"lr", "flag", "bad\nname", "x" * 129} & set(wire["logged"]) and "reward_mean" not in wire


def test_the_memory_sample_carries_the_peak_since_the_last_sample_and_the_gpu_capacity():
    resets = []
    sampler = MemorySampler(every_s=5.0, stats_fn=lambda: {"allocated_bytes.all.peak": 7 * 2**30},
                            enabled_fn=lambda: True, reset_peak_fn=lambda: resets.append(1),
                            total_fn=lambda: 141 * 2**30)
    out = sampler.maybe_sample(0.0)
    assert (out["peak_allocated_bytes"], out["total_bytes"], len(resets)) == (7 * 2**30, 141 * 2**30, 1)


class _Allocator:
    """torch.cuda's allocator statistics as a job sees them, without a GPU (this machine has none): the peak stays
    at the highest allocation until reset."""

    def __init__(self):
        self.current = self.peak = 0

    def alloc(self, n: int) -> None:
        self.current += n
        self.peak = max(self.peak, self.current)

    def free(self, n: int) -> None:
        self.current -= n

    def stats(self) -> dict:
        return {"allocated_bytes.all.current": self.current, "allocated_bytes.all.peak": self.peak,
                "reserved_bytes.all.current": self.peak}

    def reset_peak(self, device=None) -> None:
        self.peak = self.current


def test_the_first_memory_sample_is_the_peak_since_attach_not_an_earlier_phase_of_the_process(monkeypatch):
    # The H200 run of issue 20: the process loaded a model (a 100 GiB high point) before attaching; the first
    # report said 100 GiB for a loop whose steps need 5, and the first prediction was 162 GiB for batch 5.
    import torch

    gib = 2**30
    alloc = _Allocator()
    for name, fn in {"is_available": lambda: True, "is_initialized": lambda: True, "memory_stats": alloc.stats,
                     "reset_peak_memory_stats": alloc.reset_peak, "current_device": lambda: 0,
                     "get_device_properties": lambda d: type("P", (), {"total_memory": 141 * gib})()}.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    alloc.alloc(100 * gib)   # an earlier phase of the same process
    alloc.free(98 * gib)     # 2 GiB of weights stay
    hook = attach("peak-since-attach", memory_every_s=1e-9, cuda_events=False)
    alloc.alloc(3 * gib)     # the step's activations
    alloc.free(3 * gib)
    hook.step_end(samples=1)
    memory = hook.last_report.memory
    assert memory["peak_allocated_bytes"] == 5 * gib and memory["total_bytes"] == 141 * gib
    alloc.alloc(1 * gib)
    alloc.free(1 * gib)
    hook.step_end(samples=1)
    assert hook.last_report.memory["peak_allocated_bytes"] == 3 * gib  # since the previous sample
    hook.close()
