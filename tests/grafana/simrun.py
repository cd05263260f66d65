"""A simulated run for the dashboards to show: two simulated nodes (one GPU without NVLink and without GPM), two
jobs with step reports from their ranks, knob changes with acknowledgements, and rebalancer decisions of every
outcome. GPU samples go through the agent's real path (simulated readings → Batch → BatchWriter); job rows are
inserted into the store's tables directly (their columns are the stable part; the write helpers are not the
subject here)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from sqlalchemy import Engine, insert

from trimtab.contract.readings import Batch, GpuInfo, NodeInfo, Readings
from trimtab.agent.simulated import SimulatedNode
from trimtab.agent.source import Inventory
from trimtab.store.ingest import BatchWriter
from trimtab.store.models import decisions, job_reports, jobs, knob_acks, knob_changes
from trimtab.store.rollup import rollup
from trimtab.grading.ledger.ticker import advance_all

HOST_A, HOST_B = "sim-a", "sim-b"
BARE_GPU = 1  # sim-b's GPU without NVLink and without GPM
JOB, OTHER_JOB = "ppo-demo", "grpo-b"
SAMPLE_EVERY_MS = 5_000
STEP_EVERY_MS = 20_000
GPM_FIELDS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_util_pct")
NVLINK_FIELDS = ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")


class BareGpuNode:
    """A simulated node whose GPU ``bare`` has no NVLink and no GPM: its inventory says so (link count None,
    gpm_supported False), its samples carry None for those metrics and it has no per-link readings, as the NVML
    source reports such a GPU."""

    kind = "simulated"

    def __init__(self, node: SimulatedNode, bare: int):
        self.node, self.bare = node, bare

    def inventory(self) -> Inventory:
        inv = self.node.inventory()
        gpus = [dataclasses.replace(g, nvlink_link_count=None, gpm_supported=False) if g.index == self.bare else g
                for g in inv.gpus]
        return dataclasses.replace(inv, gpus=gpus)

    def _strip(self, readings: Readings) -> Readings:
        bare_uuid = self.node.inventory().gpus[self.bare].uuid
        for s in readings.gpu_samples:
            if s.gpu_uuid == bare_uuid:
                for f in GPM_FIELDS + NVLINK_FIELDS:
                    setattr(s, f, None)
        readings.nvlink_samples = [n for n in readings.nvlink_samples if n.gpu_uuid != bare_uuid]  # no links
        return readings

    def sample(self, ts_ms: int) -> Readings:
        return self._strip(self.node.sample(ts_ms))

    def readings_at(self, tick: int, ts_ms: int) -> Readings:
        return self._strip(self.node.readings_at(tick, ts_ms))

    def close(self) -> None:
        self.node.close()


def sources() -> list[tuple[NodeInfo, object]]:
    """(node, source) of both simulated nodes."""
    a = SimulatedNode(4, "actor-hot", seed=0, hostname=HOST_A)
    b = BareGpuNode(SimulatedNode(2, "balanced", seed=1, hostname=HOST_B), BARE_GPU)
    return [(NodeInfo(hostname=HOST_A, simulated=True, scenario="actor-hot"), a),
            (NodeInfo(hostname=HOST_B, simulated=True, scenario="balanced"), b)]


def gpus_of(source) -> list[GpuInfo]:
    return source.inventory().gpus


def write_samples(engine: Engine, start_ms: int, end_ms: int) -> int:
    """Samples of both nodes every SAMPLE_EVERY_MS in [start_ms, end_ms), in batches of a minute."""
    writer = BatchWriter(engine)
    n = 0
    try:
        for node, src in sources():
            gpus = gpus_of(src)
            ticks = list(range((end_ms - start_ms) // SAMPLE_EVERY_MS))
            for i in range(0, len(ticks), 12):
                batch = Batch(node=node, gpus=gpus)
                for tick in ticks[i:i + 12]:
                    batch.gpu_samples.extend(src.readings_at(tick, start_ms + tick * SAMPLE_EVERY_MS).gpu_samples)
                writer.write(batch)
                n += len(batch.gpu_samples)
    finally:
        writer.close()
    return n


def _job(conn, name: str, ranks: int, device_map: dict, hostnames: list[str], knobs: dict, mode: str,
         created_ms: int, roles: Optional[list] = None) -> int:
    return conn.execute(insert(jobs).values(name=name, ranks=ranks, device_map=device_map, hostnames=hostnames,
                                            knobs=knobs, mode=mode, created_ms=created_ms, updated_ms=created_ms,
                                            roles=roles)
                        .returning(jobs.c.id)).scalar_one()


def report(job_id: int, step: int, rank: int, received_ms: int, hostname: str, *, latency: Optional[float],
           ooms: int) -> dict:
    """One rank's report of one step: ~5 s steps, generation-bound early, composition shifting later; a short wait
    for rollout in every step, a validation run every 10th, a checkpoint every 25th (every phase a report carries)."""
    step_time = 4.0 + (step % 7) * 0.25 + rank * 0.1
    gen_share = 0.6 - 0.002 * step
    phases = {"generation_s": step_time * gen_share, "evaluation_s": step_time * 0.2,
              "communication_s": step_time * 0.12, "update_s": step_time * 0.05, "wait_s": step_time * 0.01,
              "validation_s": step_time * 0.02 if step % 10 == 0 else None,
              "checkpoint_s": step_time * 0.01 if step % 25 == 0 else None}
    phases["other_s"] = max(0.0, step_time - sum(v for v in phases.values() if v is not None))
    reserved = 40 * 2**30
    frag = 0.10 + 0.002 * step + 0.01 * rank
    return dict(job_id=job_id, step=step, rank=rank, received_ms=received_ms, step_time_s=step_time, **phases,
                samples=32, tokens=32 * 512, allocated_bytes=int(reserved * (1 - frag)), reserved_bytes=reserved,
                fragmentation=frag, num_alloc_retries=step // 10, num_ooms=ooms, collective_latency_us=latency,
                pid=1000 + rank, hostname=hostname, local_gpu=rank)


def write_jobs(engine: Engine, now_ms: int) -> dict[str, int]:
    """Both jobs with reports over the last 40 minutes, knob changes and decisions; returns job ids by name."""
    start = now_ms - 40 * 60_000
    knobs = {"batch_size": {"value": 16, "min": 1, "max": 64}, "prefetch": {"value": 2, "min": 0, "max": 8},
             "sync_every": {"value": 2, "min": 1, "max": 8}}
    with engine.begin() as conn:
        found = [{"role": role, "node": HOST_A, "gpus": gpus, "pids": [4000 + g for g in gpus], "source": "found"}
                 for role, gpus in (("actor", [0, 1]), ("critic", [2]), ("reward", [3]))]  # as the verl plugin does
        job_id = _job(conn, JOB, 2, {"actor": [0, 1], "critic": [2], "reward": [3]}, [HOST_A], knobs, "auto", start,
                      roles=found)
        other_id = _job(conn, OTHER_JOB, 1, {"actor": [0], "reward": [1]}, [HOST_B],
                        {"batch_size": {"value": 4, "min": 1, "max": 16}}, "advise", start)
        rows = []
        for step in range(120):
            t = start + (step + 1) * STEP_EVERY_MS - 1_000  # every rank's report before now
            latency = 20.0 + (0.0 if step < 60 else 25.0)  # the baseline 20 µs, then 2.25× it
            for rank in range(2):
                rows.append(report(job_id, step, rank, t + rank * 30, HOST_A, latency=latency + rank,
                                   ooms=0 if step < 70 else 1))
        for step in range(30):
            rows.append(report(other_id, step, 0, start + (step + 1) * 60_000, HOST_B, latency=None, ooms=0))
        conn.execute(insert(job_reports), rows)

        def change(knob, value, previous, status, created, applied_step=None, source="rebalancer", acks=0):
            cid = conn.execute(insert(knob_changes).values(
                job_id=job_id, knob=knob, value=value, previous_value=previous, reason=f"{knob} {previous} → {value}",
                source=source, status=status, created_ms=created, applied_step=applied_step,
                applied_ms=created + 20_000 if applied_step is not None else None).returning(knob_changes.c.id)
            ).scalar_one()
            for rank in range(acks):
                conn.execute(insert(knob_acks).values(change_id=cid, rank=rank, applied_at_step=applied_step,
                                                      acked_ms=created + 20_000 + rank))
            return cid

        kept = change("batch_size", 16, 8, "applied", start + 10 * 60_000, 30, acks=2)
        rolled = change("prefetch", 4, 2, "applied", start + 20 * 60_000, 60, acks=2)
        change("prefetch", 2, 4, "applied", start + 25 * 60_000, 75, acks=2)  # the roll-back
        change("sync_every", 4, 2, "superseded", start + 30 * 60_000, source="manual")
        pending = change("sync_every", 4, 2, "pending", start + 35 * 60_000)
        decision_rows = [
            dict(ts_ms=start + 5 * 60_000, rule="utilization_spread", evidence={"spread_pts": 72.4},
                 outcome="advised", advice="Move the reward model to its own GPU."),
            dict(ts_ms=start + 10 * 60_000, rule="generation_bound", evidence={"generation_share_pct": 58.0},
                 change_id=kept, knob="batch_size", old_value=8, new_value=16, applied_step=30,
                 throughput_before_samples_per_s=11.5, throughput_after_samples_per_s=13.2, outcome="kept"),
            dict(ts_ms=start + 20 * 60_000, rule="evaluation_bound", evidence=LEARNING_ROLLBACK_EVIDENCE,
                 change_id=rolled, knob="prefetch", old_value=2, new_value=4, applied_step=60,
                 throughput_before_samples_per_s=13.2, throughput_after_samples_per_s=12.9, outcome="rolled_back"),
            dict(ts_ms=start + 35 * 60_000, rule="collective_latency", evidence={"x_baseline": 2.25},
                 change_id=pending, knob="sync_every", old_value=2, new_value=4,
                 throughput_before_samples_per_s=12.8, outcome="pending"),
        ]
        optional = ("change_id", "knob", "old_value", "new_value", "applied_step", "throughput_before_samples_per_s",
                    "throughput_after_samples_per_s", "advice")
        conn.execute(insert(decisions), [dict(dict.fromkeys(optional), job_id=job_id, **d) for d in decision_rows])
    return {JOB: job_id, OTHER_JOB: other_id}


def _learning_rollback_evidence() -> dict:
    """A prefetch raise rolled back because its clip fraction climbed, while its throughput was still measured:
    the evidence goodput.py writes, its verdicts worded by goodput.py's own functions."""
    from trimtab.control.goodput import Broken, learning_words, throughput_words

    shown = {"clip_fraction": {"before": 0.04, "after": 0.15, "steps": [10, 6], "holds": False}}
    broken = Broken("clip_fraction", 0.04, 0.15, "rose by +0.110, bound +0.05")
    evidence = {"evaluation_share_pct": 52.0, "learning_guards": shown,
                "learning_broken": {"signal": "clip_fraction", "before": 0.04, "after": 0.15, "bound": broken.bound}}
    return {**evidence, "verdicts": {"throughput": throughput_words(evidence, None),
                                     "learning": learning_words(shown, broken, 4)}}


LEARNING_ROLLBACK_EVIDENCE = _learning_rollback_evidence()


def populate(engine: Engine, now_ms: int, minutes: int = 50) -> None:
    """The whole run, ending at ``now_ms``; then the rollups, as the server's maintenance would."""
    # Off the 5 s grid of ``now_ms`` by half a period, so no sample sits on a window edge that ends at now.
    write_samples(engine, now_ms - minutes * 60_000 + SAMPLE_EVERY_MS // 2, now_ms)
    write_jobs(engine, now_ms)
    rollup(engine, now_ms)
    advance_all(engine, now_ms)  # the GPU-time ledger's accumulated table, as the server's ticker fills it
