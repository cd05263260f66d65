"""The GPU-time ledger against the truth: a simulated 4-GPU node plays the ``pipeline`` scenario (each GPU's
utilization follows its role's phases, trimtab.agent.scenarios.PIPELINE_SCHEDULE), and a synthetic four-process job
placed actor: [0, 1], critic: [2], reward: [3] posts its step reports through the HTTP API, each stamped when its
step ended (plus a little delivery latency; one rank's reports queued through an outage and sent together). The
test computes the true GPU-seconds of every role, phase and wait from the schedule itself — busy = the phases'
kernel time, host = the rest of non-wait phases, a wait is for the roles whose GPUs work at that moment (split
evenly) — and checks every cell of ``GET /v1/jobs/{name}/gpu-time`` within 5 %, busy + idle within 1 % of wall ×
GPUs."""

from __future__ import annotations

import random

import pytest

import trimtab.store.jobs as job_store
from trimtab.agent.scenarios import PIPELINE_SCHEDULE
from trimtab.agent.simulated import SimulatedNode
from trimtab.contract.readings import Batch, NodeInfo
from trimtab.contract.step_report import GPU_PHASES

HOST = "pipe-node"
PLACEMENT = {"actor": [0, 1], "critic": [2], "reward": [3]}
RANKS = ((0, "actor", 0, 4100), (1, "actor", 1, 4101), (2, "critic", 2, 4102), (3, "reward", 3, 4103))
STEPS = 48
TICK_MS = 497  # the agent's samples drift against the 10 s step, as a real sampler's do
EDGE_S = 20    # the window starts this long before the first step and ends this long after the last
OUTAGE = (3, range(30, 36))  # rank 3's reports of these steps are queued and sent together at the last one's end


def truth(period_s: float, steps: int, edge_s: float) -> dict[tuple, float]:
    """GPU-seconds by (gpu, kind, role, phase or cause, waiting_for), from the schedule alone."""
    out: dict[tuple, float] = {}

    def add(key, seconds):
        out[key] = out.get(key, 0.0) + seconds * steps

    def busy_roles(t: float, me: str) -> list[str]:
        return sorted({role for role, segs in PIPELINE_SCHEDULE.roles.items() if role != me
                       for s in segs if s.start_s <= t < s.end_s and s.gpu_s > 0})

    for _, role, gpu, _ in RANKS:
        for s in PIPELINE_SCHEDULE.roles[role]:
            if s.phase == "wait":
                dt = 0.001
                for i in range(round((s.end_s - s.start_s) / dt)):
                    who = busy_roles(s.start_s + (i + 0.5) * dt, role)
                    for other in who:
                        add((gpu, "idle", role, "waiting", other), dt / len(who))
            elif s.phase == "communication":
                add((gpu, "idle", role, "communication", ""), s.end_s - s.start_s)
            else:
                if s.gpu_s:
                    add((gpu, "busy", role, s.phase, ""), s.gpu_s)
                add((gpu, "idle", role, "host", ""), s.end_s - s.start_s - s.gpu_s)
        out[(gpu, "idle", "", "no_job", "")] = 2 * edge_s
    return out


def report(step: int, rank: int, role: str, gpu: int, pid: int) -> dict:
    wall: dict[str, float] = {}
    kernels: dict[str, float] = {}
    for s in PIPELINE_SCHEDULE.roles[role]:
        wall[s.phase] = wall.get(s.phase, 0.0) + s.end_s - s.start_s
        if s.phase in GPU_PHASES:
            kernels[s.phase] = kernels.get(s.phase, 0.0) + s.gpu_s
    return {"step": step, "rank": rank, "step_time_s": PIPELINE_SCHEDULE.period_s, "phases": wall,
            "gpu_phases": kernels, "pid": pid, "hostname": HOST, "local_gpu": gpu, "samples": 8}


def play(api, monkeypatch, t0_ms: int) -> None:
    period_ms = int(PIPELINE_SCHEDULE.period_s * 1000)
    roles = [{"role": role, "node": HOST, "gpus": [gpu], "pids": [pid], "source": "found"}
             for _, role, gpu, pid in RANKS]
    r = api.post("/v1/jobs", {"name": "pipe", "ranks": 4, "hostnames": [HOST], "roles": roles, "mode": "off"},
                 scope="job")
    assert r.status_code in (200, 201), r.text
    node = SimulatedNode(4, scenario="pipeline", hostname=HOST)
    first, last = t0_ms - (EDGE_S + 10) * 1000, t0_ms + STEPS * period_ms + (EDGE_S + 10) * 1000
    ticks = list(range(first, last, TICK_MS))
    for a in range(0, len(ticks), 100):
        samples = [s for i, ts in enumerate(ticks[a:a + 100], a) for s in node.readings_at(i, ts).gpu_samples]
        batch = Batch(node=NodeInfo(hostname=HOST, simulated=True, scenario="pipeline"),
                      gpus=node.inventory().gpus, gpu_samples=samples)
        assert api.ingest(batch).status_code in (200, 202), "ingest"
    rng = random.Random(40)
    queued = []
    for step in range(1, STEPS + 1):
        end_ms = t0_ms + step * period_ms
        for rank, role, gpu, pid in RANKS:
            body = report(step, rank, role, gpu, pid)
            if rank == OUTAGE[0] and step in OUTAGE[1]:
                queued.append(body)
                if step != OUTAGE[1][-1]:
                    continue
                monkeypatch.setattr(job_store, "now_ms", lambda e=end_ms: e + 40)
                r = api.post("/v1/jobs/pipe/report-batches", {"reports": queued}, scope="job")
            else:
                monkeypatch.setattr(job_store, "now_ms", lambda e=end_ms: e + rng.randint(5, 80))
                r = api.post("/v1/jobs/pipe/reports", body, scope="job")
            assert r.status_code in (200, 201, 202), r.text
    monkeypatch.undo()


@pytest.mark.parametrize("interval", [None, "60s"])
def test_every_ledger_cell_is_within_5_percent_of_the_schedules_truth(api, monkeypatch, interval):
    import time

    period_ms = int(PIPELINE_SCHEDULE.period_s * 1000)
    now = int(time.time() * 1000)
    t0_ms = now - now % period_ms - (STEPS + 6) * period_ms
    play(api, monkeypatch, t0_ms)
    window_s = STEPS * PIPELINE_SCHEDULE.period_s + 2 * EDGE_S
    end_ms = t0_ms + STEPS * period_ms + EDGE_S * 1000
    r = api.get("/v1/jobs/pipe/gpu-time", window=f"{window_s:g}s", end_ms=end_ms, interval=interval)
    assert r.status_code == 200, r.text
    body = r.json()
    assert abs(body["busy_gpu_s"] + body["idle_gpu_s"] - body["wall_gpu_s"]) <= 0.01 * body["wall_gpu_s"]
    assert body["wall_gpu_s"] == pytest.approx(4 * window_s)
    got: dict[tuple, float] = {}
    for t in body["totals"]:
        key = (t["gpu"], t["kind"], t["role"], t["phase"] or t["cause"], t["waiting_for"] or "")
        got[key] = got.get(key, 0.0) + t["gpu_s"]
    expected = truth(PIPELINE_SCHEDULE.period_s, STEPS, EDGE_S)
    misses = {k: (round(got.get(k, 0.0), 2), round(v, 2)) for k, v in expected.items()
              if abs(got.get(k, 0.0) - v) > 0.05 * v}
    extra = {k: round(v, 2) for k, v in got.items() if k not in expected and v > 0.01 * window_s}
    assert not misses and not extra, f"ledger vs truth: {misses}; cells the truth has not: {extra}"
    print({k: (round(got.get(k, 0.0), 1), round(v, 1)) for k, v in sorted(expected.items())})
