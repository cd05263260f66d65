"""Two real ranks (two processes, gloo over a loopback TCP store): a change queued through the API takes effect
at the same step on both and each rank acknowledges that step; an OOM on one rank halves the batch on both at the
same step; the all-reduce latency probe reports µs against the job's own baseline.

Run as a module (``python -m tests.trainer.test_hook_ranks RANK WORLD PORT OUT SCENARIO [URL TOKEN]``) it is one
rank of those jobs.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from tests.support import procs
from tests.support.waits import eventually

JOB = "ppo-2ranks"
KNOBS = {"batch_size": (8, 1, 64), "prefetch": (0, 0, 4), "sync_every": (1, 1, 4)}
MAX_STEPS = 600  # ~6 s at 10 ms a step: the change arrives within a few steps of registration


def run_ranks(tmp_path: Path, scenario: str, *extra: str, world: int = 2) -> list[dict]:
    return procs.run_ranks("tests.trainer.test_hook_ranks", tmp_path, scenario, *extra, world=world, timeout_s=60)


def test_a_queued_change_is_applied_at_the_same_step_on_both_ranks_and_acked_with_it(sqlite_api, tmp_path):
    api = sqlite_api
    job_token = api.token("job")

    def queue_change_once_registered():
        eventually(lambda: api.get(f"/v1/jobs/{JOB}").status_code == 200, timeout_s=30)
        r = api.post(f"/v1/jobs/{JOB}/changes", {"knob": "batch_size", "value": 16, "reason": "gen-bound"},
                     token=api.admin_token)
        assert r.status_code == 201, r.text

    admin = threading.Thread(target=queue_change_once_registered)
    admin.start()
    ranks = run_ranks(tmp_path, "change", api.url, job_token)
    admin.join()
    first_16 = [r["sizes"].index(16) for r in ranks]
    assert first_16[0] == first_16[1] > 0, ranks  # same step on both ranks
    for r in ranks:
        applied = first_16[0]
        assert set(r["sizes"][:applied]) == {8} and set(r["sizes"][applied:]) == {16}
        assert r["changes"] == [["batch_size", 8, 16, r["changes"][0][3]]] and r["changes"][0][3] > 0
    (change,) = api.get(f"/v1/jobs/{JOB}/changes").json()["changes"]
    assert change["status"] == "applied" and change["applied_step"] == first_16[0]
    assert sorted((a["rank"], a["applied_at_step"]) for a in change["acks"]) == [(0, first_16[0]), (1, first_16[0])]
    job = api.get(f"/v1/jobs/{JOB}").json()
    assert job["ranks"] == 2 and job["knobs"]["batch_size"]["value"] == 16
    reports = api.get(f"/v1/jobs/{JOB}/reports", limit=500).json()["reports"]
    assert {r["rank"] for r in reports} == {0, 1} and len({r["pid"] for r in reports}) == 2


def test_an_oom_on_one_rank_shrinks_both_and_the_probe_reports_against_its_baseline(tmp_path):
    ranks = run_ranks(tmp_path, "oom-probe")
    for r in ranks:
        assert r["sizes"] == [8] * 5 + [4] * 5  # rank 1 ran out of memory in step 4; both switch at step 5
        latencies = r["latency_us"]
        probed = [latencies[i] for i in range(1, 10, 2)]  # probe_every=2: at the ends of steps 1, 3, 5, 7, 9
        assert all(0 < us < 1e6 for us in probed) and all(latencies[i] is None for i in range(0, 10, 2))
        assert r["baseline_us"] == sorted(probed[:3])[1]  # median of the first three probes
    assert ranks[1]["ooms"] == 1 and ranks[0]["ooms"] == 0


def _rank_main(rank: int, world: int, port: int, out: str, scenario: str, url: str | None = None,
               token: str | None = None) -> None:
    import logging

    import torch
    import torch.distributed as dist

    from trimtab.trainer import attach

    logging.basicConfig(level=logging.INFO, format=f"%(relativeCreated)d rank {rank}: %(message)s")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    result: dict = {"sizes": [], "changes": [], "latency_us": []}
    if scenario == "change":
        hook = attach(JOB, url, token, knobs=KNOBS, backoff_max_s=0.2)
        hook.on_change(lambda *c: result["changes"].append(list(c)))
        for _ in range(MAX_STEPS):  # every rank sees the same sizes at the same step, so all stop together
            result["sizes"].append(hook.knobs["batch_size"])
            time.sleep(0.01)
            hook.step_end(samples=hook.knobs["batch_size"])
            if result["sizes"].count(16) >= 3:
                break
    else:
        hook = attach(JOB, None, knobs=KNOBS, probe_every=2, probe_baseline_n=3)
        for step in range(10):
            result["sizes"].append(hook.knobs["batch_size"])
            with hook.oom_guard():
                if rank == 1 and step == 4:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            hook.step_end(samples=result["sizes"][-1])
            result["latency_us"].append(hook.last_report.collective_latency_us)
        result["baseline_us"] = hook.stats["collective_baseline_us"]
    result["ooms"] = hook.ooms
    hook.close()
    dist.destroy_process_group()
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
