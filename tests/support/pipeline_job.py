"""A synthetic four-process RL job on a simulated 4-GPU node playing the ``pipeline`` scenario: the node's samples
and the job's step reports (through the HTTP API, each stamped when its step ended), and the true GPU-seconds of
every role, phase and wait computed from the schedule itself (trimtab.agent.scenarios.PIPELINE_SCHEDULE)."""

from __future__ import annotations

import random

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


def play(api, monkeypatch, t0_ms: int, steps: int = STEPS, name: str = "pipe", registered_ms=None) -> None:
    """Registers the job (at ``registered_ms``, default 30 s before t0_ms), ingests the node's samples and posts
    the job's ``steps`` steps from t0_ms."""
    period_ms = int(PIPELINE_SCHEDULE.period_s * 1000)
    roles = [{"role": role, "node": HOST, "gpus": [gpu], "pids": [pid], "source": "found"}
             for _, role, gpu, pid in RANKS]
    monkeypatch.setattr(job_store, "now_ms", lambda: t0_ms - 30_000 if registered_ms is None else registered_ms)
    r = api.post("/v1/jobs", {"name": name, "ranks": 4, "hostnames": [HOST], "roles": roles, "mode": "off"},
                 scope="job")
    assert r.status_code in (200, 201), r.text
    node = SimulatedNode(4, scenario="pipeline", hostname=HOST)
    first, last = t0_ms - (EDGE_S + 10) * 1000, t0_ms + steps * period_ms + (EDGE_S + 10) * 1000
    ticks = list(range(first, last, TICK_MS))
    for a in range(0, len(ticks), 100):
        samples = [s for i, ts in enumerate(ticks[a:a + 100], a) for s in node.readings_at(i, ts).gpu_samples]
        batch = Batch(node=NodeInfo(hostname=HOST, simulated=True, scenario="pipeline"),
                      gpus=node.inventory().gpus, gpu_samples=samples)
        assert api.ingest(batch).status_code in (200, 202), "ingest"
    rng = random.Random(40)
    queued = []
    for step in range(1, steps + 1):
        end_ms = t0_ms + step * period_ms
        for rank, role, gpu, pid in RANKS:
            body = report(step, rank, role, gpu, pid)
            if rank == OUTAGE[0] and step in OUTAGE[1]:
                queued.append(body)
                if step != OUTAGE[1][-1]:
                    continue
                monkeypatch.setattr(job_store, "now_ms", lambda e=end_ms: e + 40)
                r = api.post(f"/v1/jobs/{name}/report-batches", {"reports": queued}, scope="job")
            else:
                monkeypatch.setattr(job_store, "now_ms", lambda e=end_ms: e + rng.randint(5, 80))
                r = api.post(f"/v1/jobs/{name}/reports", body, scope="job")
            assert r.status_code in (200, 201, 202), r.text
    monkeypatch.undo()


def play_ending_now(api, monkeypatch, steps: int, name: str = "pipe", steps_ago: int = 3) -> int:
    """Plays ``steps`` steps registered at their start and ending ``steps_ago`` steps before now (on the period's
    grid); returns the first step's start (epoch ms)."""
    import time

    period_ms = int(PIPELINE_SCHEDULE.period_s * 1000)
    now = int(time.time() * 1000)
    t0_ms = now - now % period_ms - (steps + steps_ago) * period_ms
    play(api, monkeypatch, t0_ms, steps=steps, name=name, registered_ms=t0_ms)
    return t0_ms
