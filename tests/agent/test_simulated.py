"""The simulated node: deterministic per (seed, tick, GPU), each scenario shows its signature, readings stay
physical, and the inventory says it is simulated."""

from __future__ import annotations

import dataclasses

import pytest

from trimtab.contract.readings import GPU_METRIC_NAMES
from trimtab.agent.scenarios import GPU_PROCESSES, STEP, device_roles, phase_at
from trimtab.agent.simulated import (NVLINK_PEAK_BYTES_PER_S, PCIE_PEAK_BYTES_PER_S, PROCESS_EVERY_TICKS,
                                     SCENARIOS, SimulatedNode)
from trimtab.agent.source import Source

TICKS = 400  # longer than the slowest oscillation period (240 ticks)
PID_MAX_LIMIT = 2**22  # the largest PID a Linux host can give


def run(node: SimulatedNode, ticks: int = TICKS):
    return [node.sample(1_000 * t) for t in range(ticks)]


def util(readings):
    return [s.util_pct for s in readings.gpu_samples]


def mem_pct(s):
    return 100.0 * s.mem_used_bytes / s.mem_total_bytes


def pcie_pct(s):
    return 100.0 * max(s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s) / PCIE_PEAK_BYTES_PER_S


def test_it_is_a_source_and_says_it_is_simulated():
    node = SimulatedNode(4, scenario="actor-hot", hostname="box")
    assert isinstance(node, Source) and node.kind == "simulated"
    inv = node.inventory()
    assert inv.simulated and inv.scenario == "actor-hot" and inv.driver_version is None
    assert [g.uuid for g in inv.gpus] == [f"GPU-sim-box-{i}" for i in range(4)]
    gpu = inv.gpus[0]
    assert gpu.name == "Simulated H100 80GB (trimtab)" and gpu.memory_total_bytes == 80 * 1024**3
    assert (gpu.pcie_max_gen, gpu.pcie_max_width, gpu.nvlink_link_count) == (5, 16, 18)
    assert gpu.pcie_peak_bytes_per_s == pytest.approx(63.0e9, rel=0.01)


def test_same_seed_same_readings_whatever_the_clock():
    a = run(SimulatedNode(4, seed=7), 50)
    every = PROCESS_EVERY_TICKS
    b = [SimulatedNode(4, seed=7).readings_at(t, 1_000 * t, 1_000 * (t - every) if t >= every else None)
         for t in range(50)]
    assert a == b


def test_the_kth_sample_is_tick_k():
    node = SimulatedNode(4, seed=3)
    ticks = run(node, 10)
    assert node.readings_at(9, 9_000) == ticks[9]


def test_a_different_seed_gives_different_readings():
    a = run(SimulatedNode(4, seed=1), 20)
    b = run(SimulatedNode(4, seed=2), 20)
    assert [util(r) for r in a] != [util(r) for r in b]


def test_readings_move_from_tick_to_tick():
    ticks = run(SimulatedNode(4), 20)
    assert len({tuple(util(r)) for r in ticks}) == 20


def test_balanced_is_in_trim():
    for r in run(SimulatedNode(4, scenario="balanced")):
        u = util(r)
        assert max(u) - min(u) < 25
        for s in r.gpu_samples:
            assert 62 <= s.util_pct <= 75
            assert s.sm_active_pct < s.util_pct
            assert 55 <= mem_pct(s) <= 70
            assert pcie_pct(s) < 30


def test_actor_hot_is_seed_scenario_one():
    for r in run(SimulatedNode(4, scenario="actor-hot")):
        u = util(r)
        assert all(90 <= x <= 99 for x in u[0:2]), u  # actor + ref on GPU 0/1
        assert u[2] < 30  # critic idles
        assert 30 < u[3] < 90  # reward moderate
        assert max(u) - min(u) > 40


def test_reward_memory_is_seed_scenario_two():
    for r in run(SimulatedNode(4, scenario="reward-memory")):
        reward = r.gpu_samples[3]
        assert reward.mem_used_bytes == reward.mem_total_bytes - reward.mem_reserved_bytes
        assert reward.util_pct >= 85
        assert all(55 <= mem_pct(s) <= 70 for s in r.gpu_samples[:3])


def test_pcie_saturated_is_the_reward_gpu_only():
    for r in run(SimulatedNode(4, scenario="pcie-saturated")):
        reward = r.gpu_samples[3]
        assert reward.pcie_tx_bytes_per_s > 0.9 * PCIE_PEAK_BYTES_PER_S
        assert reward.pcie_rx_bytes_per_s > 0.9 * PCIE_PEAK_BYTES_PER_S
        assert all(pcie_pct(s) < 30 for s in r.gpu_samples[:3])


def test_extra_gpus_are_actor_shards():
    for r in run(SimulatedNode(8, scenario="actor-hot"), 50):
        assert all(u >= 90 for u in util(r)[4:])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("n_gpus", [1, 2, 3, 4, 8])
def test_every_reading_is_physical(scenario, n_gpus):
    for r in run(SimulatedNode(n_gpus, scenario=scenario, seed=n_gpus), 150):
        assert len(r.gpu_samples) == n_gpus and not r.events
        for p in r.processes:
            assert p.pid > PID_MAX_LIMIT and p.name.startswith("simulated ")
            assert p.sm_util_pct is None or (0 <= p.mem_util_pct <= p.sm_util_pct <= 100 and p.util_samples > 0)
        for s in r.gpu_samples:
            assert all(getattr(s, name) is not None for name in GPU_METRIC_NAMES)
            for pct in (s.util_pct, s.sm_active_pct, s.sm_occupancy_pct, s.tensor_active_pct, s.dram_bw_util_pct):
                assert 0 <= pct <= 100
            assert s.sm_active_pct <= s.util_pct and s.tensor_active_pct <= s.sm_active_pct
            assert 0 < s.mem_used_bytes and s.mem_used_bytes + s.mem_reserved_bytes <= s.mem_total_bytes
            assert 0 <= s.pcie_tx_bytes_per_s <= PCIE_PEAK_BYTES_PER_S
            assert 0 <= s.pcie_rx_bytes_per_s <= PCIE_PEAK_BYTES_PER_S
            assert 0 <= s.nvlink_tx_bytes_per_s <= NVLINK_PEAK_BYTES_PER_S
            assert 60 <= s.power_w <= 700 and 20 <= s.temperature_c <= 90
            assert s.sm_clock_mhz > 0 and s.clock_event_mask >= 0
            assert isinstance(s.mem_used_bytes, int) and isinstance(s.sm_clock_mhz, int)


def test_readings_serialize():
    from trimtab.contract.readings import Batch, NodeInfo

    node = SimulatedNode(4)
    batch = Batch(node=NodeInfo(hostname="h", simulated=True), gpus=node.inventory().gpus,
                  gpu_samples=node.sample(0).gpu_samples)
    assert Batch.from_json(batch.to_json()) == batch


def test_an_unknown_scenario_names_the_valid_ones():
    with pytest.raises(ValueError) as info:
        SimulatedNode(4, scenario="nope")
    for name in ("balanced", "actor-hot", "reward-memory", "pcie-saturated"):
        assert name in str(info.value)


def test_scenarios_are_exposed_by_name():
    assert set(SCENARIOS) == {"balanced", "actor-hot", "reward-memory", "pcie-saturated", "pipeline"}
    assert all(dataclasses.is_dataclass(s) and s.description for s in SCENARIOS.values())


def test_zero_gpus_is_refused():
    with pytest.raises(ValueError):
        SimulatedNode(0)


def test_each_gpu_holds_its_roles_processes_every_few_ticks_labelled_simulated():
    ticks = run(SimulatedNode(4, hostname="box"), 3 * PROCESS_EVERY_TICKS + 1)
    with_rows = [t for t, r in enumerate(ticks) if r.processes]
    assert with_rows == list(range(0, len(ticks), PROCESS_EVERY_TICKS))
    for t in with_rows:
        names = {}
        for p in ticks[t].processes:
            names.setdefault(p.gpu_uuid, []).append(p.name)
            assert p.ts_ms == 1_000 * t and p.used_memory_bytes > 0
        assert names == {f"GPU-sim-box-{i}": [f"simulated {n}" for n in GPU_PROCESSES[role]]
                         for i, role in enumerate(device_roles(4))}
    pids = {p.pid for t in with_rows for p in ticks[t].processes}
    assert len(pids) == 6 and min(pids) > PID_MAX_LIMIT  # actor+ref on GPUs 0 and 1, critic, reward


def test_the_first_process_rows_are_a_baseline_with_activity_unknown_not_zero():
    first = run(SimulatedNode(4), 1)[0]
    assert first.processes
    for p in first.processes:
        assert (p.sm_util_pct, p.mem_util_pct, p.util_samples, p.util_from_ms, p.util_to_ms) == (None,) * 5


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_gpus_processes_add_up_to_its_util_and_the_phase_says_which_one_works(scenario):
    ticks = run(SimulatedNode(4, scenario=scenario, seed=5), 6 * PROCESS_EVERY_TICKS + 1)
    for end in range(PROCESS_EVERY_TICKS, len(ticks), PROCESS_EVERY_TICKS):
        covered = range(end - PROCESS_EVERY_TICKS + 1, end + 1)  # the ticks after the previous rows, this one too
        for i, uuid in enumerate(s.gpu_uuid for s in ticks[end].gpu_samples):
            rows = {p.name.split()[-1]: p for p in ticks[end].processes if p.gpu_uuid == uuid}
            for p in rows.values():
                assert (p.util_from_ms, p.util_to_ms) == (1_000 * (end - PROCESS_EVERY_TICKS), 1_000 * end)
            # busy seconds (mean SM % over the interval x its length) of the GPU's processes = the GPU's util x 1 s
            # summed over the covered ticks
            busy_s = sum(p.sm_util_pct / 100 * (p.util_to_ms - p.util_from_ms) / 1000 for p in rows.values())
            assert busy_s == pytest.approx(sum(ticks[t].gpu_samples[i].util_pct / 100 for t in covered), rel=1e-9)
            # each process has one record in exactly the ticks whose phase gives it a share of this GPU's work
            for name, p in rows.items():
                shares = [phase_at(t).share.get(name, 1.0) if len(rows) > 1 else 1.0 for t in covered]
                assert p.util_samples == sum(share > 0 for share in shares)
    ref_phases = [phase.name for phase in STEP if phase.share.get("ref", 0) > 0]
    assert ref_phases and len(ref_phases) < len(STEP)  # the reference model idles in some phase: counts differ

def test_the_pipeline_scenario_follows_its_phase_schedule():
    from trimtab.agent.scenarios import PIPELINE_SCHEDULE

    node = SimulatedNode(4, scenario="pipeline")
    for tick, ts_ms in enumerate(range(0, 30_000, 250)):
        for s, role in zip(node.readings_at(tick, ts_ms).gpu_samples, ("actor", "actor", "critic", "reward")):
            segment = PIPELINE_SCHEDULE.segment_at(role, ts_ms)
            expected = segment.util_pct if segment.gpu_s else 1.0
            assert abs(s.util_pct - expected) <= 1.05, (ts_ms, role, segment)
