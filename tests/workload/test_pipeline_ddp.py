"""The data-parallel reference pipeline (``trimtab.workload.ddp``) with two real ranks: two processes, gloo
over a loopback TCP store, tiny config on CPU. Each rank trains on its own samples; after every update both
ranks' actors (and critics) are bit-identical, because every gradient was averaged — the averaged gradient is the
mean of the two local ones, which differ. A knob change queued on the live API is applied at the same step on
both ranks and acknowledged by both with that step. Plus the device-map arithmetic the bench relies on.

Run as a module (``python -m tests.workload.test_pipeline_ddp RANK WORLD PORT OUT URL TOKEN``) it is one rank.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from tests.support import procs
from tests.support.waits import eventually

JOB = "ppo-ddp"
KNOBS = {"batch_size": (4, 1, 16), "prefetch": (0, 0, 4), "sync_every": (1, 1, 4)}
NEW_BATCH = 8
MAX_STEPS = 150


def run_ranks(tmp_path: Path, url: str, token: str, world: int = 2) -> list[dict]:
    return procs.run_ranks("tests.workload.test_pipeline_ddp", tmp_path, url, token, world=world, timeout_s=120)


def test_two_ranks_stay_identical_and_apply_a_queued_change_at_the_same_step(sqlite_api, tmp_path):
    api = sqlite_api

    def queue_change_once_registered():
        eventually(lambda: api.get(f"/v1/jobs/{JOB}").status_code == 200, timeout_s=60)
        r = api.post(f"/v1/jobs/{JOB}/changes", {"knob": "batch_size", "value": NEW_BATCH, "reason": "gen-bound"},
                     token=api.admin_token)
        assert r.status_code == 201, r.text

    admin = threading.Thread(target=queue_change_once_registered)
    admin.start()
    ranks = run_ranks(tmp_path, api.url, api.token("job"))
    admin.join()
    r0, r1 = ranks

    # Gradient averaging: the replicas never diverge, although each rank trained on different samples.
    assert r0["initial_digest"] == r1["initial_digest"]
    assert len(r0["digests"]) == len(r1["digests"]) >= 3
    assert r0["digests"] == r1["digests"]
    assert r0["critic_digest"] == r1["critic_digest"]
    assert r0["digests"][-1] != r0["initial_digest"]                  # they did train
    assert r0["first_rewards"] != r1["first_rewards"]                  # on different data
    for module in ("0", "1"):                                          # actor, critic: the last reduction
        p0, p1 = r0["projections"][module], r1["projections"][module]
        assert p0["local"] != pytest.approx(p1["local"], rel=1e-3)     # local gradients differ …
        assert p0["averaged"] == p1["averaged"]                        # … their average is one value
        mean = [(a + b) / 2 for a, b in zip(p0["local"], p1["local"])]
        assert p0["averaged"] == pytest.approx(mean, rel=1e-4, abs=1e-9)
    steps = len(r0["sizes"])
    minibatches = r0["minibatches_per_step"]
    for r in ranks:
        assert r["grads"]["reductions"] == 2 * steps * minibatches and r["grads"]["late_flushes"] == 0

    # The knob change: the same step on both ranks, acknowledged by both.
    first = [r["sizes"].index(NEW_BATCH) for r in ranks]
    assert first[0] == first[1] > 0, ranks
    for r in ranks:
        assert set(r["sizes"][:first[0]]) == {4} and set(r["sizes"][first[0]:]) == {NEW_BATCH}
        assert r["gen_sizes"][first[0]] == [NEW_BATCH, NEW_BATCH]
    (change,) = api.get(f"/v1/jobs/{JOB}/changes").json()["changes"]
    assert change["status"] == "applied" and change["applied_step"] == first[0]
    assert sorted((a["rank"], a["applied_at_step"]) for a in change["acks"]) == [(0, first[0]), (1, first[0])]
    job = api.get(f"/v1/jobs/{JOB}").json()
    assert job["ranks"] == 2 and job["knobs"]["batch_size"]["value"] == NEW_BATCH
    reports = eventually(lambda: (got := api.get(f"/v1/jobs/{JOB}/reports", limit=1000).json()["reports"])
                         and len(got) == 2 * steps and got)
    assert {r["rank"] for r in reports} == {0, 1}
    probed = [r["collective_latency_us"] for r in reports if r["collective_latency_us"] is not None]
    assert len(probed) >= steps and all(0 < us < 1e6 for us in probed)   # probe_every=1 on both ranks


def test_job_maps_split_per_rank_and_union_back():
    from trimtab.workload.ddp import hook_map, parse_job_map, rank_device_map, split_job_map

    seed = parse_job_map("actor=0,1;ref=0,1;critic=2;reward=3")
    maps = split_job_map(seed)
    assert maps == [{"actor": [0], "ref": [0], "critic": [2], "reward": [3]},
                    {"actor": [1], "ref": [1], "critic": [2], "reward": [3]}]
    assert hook_map(maps) == {"actor": [0, 1], "critic": [2], "ref": [0, 1], "reward": [3], "rollout": [0, 1]}
    # A placement proposal (job level, rollout included) splits the same way; a shared component is shared.
    moved = split_job_map({"actor": [0, 1], "rollout": [0, 1], "ref": [3], "critic": [2], "reward": [2]})
    assert [m["ref"] for m in moved] == [[3], [3]] and [m["rollout"] for m in moved] == [[0], [1]]
    assert split_job_map({"actor": [0, 1, 2, 3], "critic": [4, 5]})[3]["critic"] == [5]
    assert parse_job_map("cpu", 2) == {"actor": ["cpu", "cpu"]}
    assert str(rank_device_map(split_job_map(parse_job_map("cpu", 2))[1])).startswith("actor cpu")
    assert hook_map(split_job_map(parse_job_map("cpu", 2))) == {}
    with pytest.raises(ValueError):
        split_job_map({"actor": [0, 1]}, world=4)
    with pytest.raises(ValueError):
        parse_job_map("critic=2")



def test_the_multigpu_bench_folds_ranks_acks_and_probes_as_the_rebalancer_does():
    from bench.pipeline_report import (ack_rows, busy_spread, combine_ranks, knob_path, parse_grid, probe_rows,
                                       server_baseline, throughput)

    assert parse_grid("64,2,4; 16,2,1") == [(64, 2, 4), (16, 2, 1)]
    rec = lambda step, samples, s, b=1: {"step": step, "samples": samples, "step_s": s, "batch_size": b,  # noqa: E731
                                         "prefetch": 0, "sync_every": 1}
    steps = combine_ranks([[rec(0, 64, 1.0), rec(1, 64, 0.5, 4)], [rec(0, 64, 2.0), rec(1, 64, 0.5, 4)]])
    assert [(s["samples"], s["step_s"], s["knobs"]) for s in steps] == [(128, 2.0, (1, 0, 1)), (128, 0.5, (4, 0, 1))]
    assert throughput(steps) == pytest.approx(256 / 2.5) and knob_path(steps) == "1/0/1 (1 steps) → 4/0/1 (1 steps)"
    with pytest.raises(ValueError):
        combine_ranks([[rec(0, 64, 1.0)], []])
    changes = [{"change_id": 2, "knob": "prefetch", "value": 2, "status": "applied", "applied_step": 9,
                "acks": [{"rank": 1, "applied_at_step": 9}, {"rank": 0, "applied_at_step": 9}]},
               {"change_id": 1, "knob": "batch_size", "value": 4, "status": "applied", "applied_step": 5,
                "acks": [{"rank": 0, "applied_at_step": 5}]}]
    rows = ack_rows(changes, 2)
    assert [(r["change_id"], r["acks"], r["all_ranks_same_step"]) for r in rows] == [(1, [5, None], False),
                                                                                     (2, [9, 9], True)]
    reports = [{"step": s, "rank": r, "collective_latency_us": us} for s, r, us in
               [(0, 0, None), (1, 1, 30.0), (1, 0, 10.0), (2, 0, 20.0), (2, 1, 40.0), (3, 0, 50.0), (3, 1, 5.0)]]
    assert server_baseline(reports) == 30.0          # first five by (step, rank): 10, 30, 20, 40, 50
    assert server_baseline(reports[:3]) is None
    assert [(p["step"], p["per_rank_us"]) for p in probe_rows(reports, 2)][0] == (1, [10.0, 30.0])
    assert busy_spread({0: 90.0, 1: 80.0, 2: 20.0}, [0, 1, 2]) == 70.0 and busy_spread({0: 1.0}, [0, 1]) is None

def _rank_main(rank: int, world: int, port: int, out: str, url: str, token: str) -> None:
    import logging

    import torch

    from trimtab.trainer import attach
    from trimtab.workload.config import preset
    from trimtab.workload.ddp import DataParallelPipeline, init_distributed, params_digest, rank_device_map

    logging.basicConfig(level=logging.INFO, format=f"%(relativeCreated)d rank {rank}: %(message)s")
    torch.set_num_threads(1)
    config = preset("tiny", samples_per_step=16, train_micro_batch=8, reward_pretrain_steps=40)
    devices = rank_device_map({"actor": ["cpu"]})
    init_distributed(devices, f"tcp://127.0.0.1:{port}", rank, world)
    hook = attach(JOB, url, token, knobs=KNOBS, probe_every=1, probe_baseline_n=3, backoff_max_s=0.2)
    result: dict = {"sizes": [], "gen_sizes": [], "digests": [], "first_rewards": None,
                    "minibatches_per_step": config.samples_per_step // config.train_micro_batch}
    with DataParallelPipeline(config, devices, hook=hook, probe_dirs=4) as pipeline:
        result["initial_digest"] = params_digest(pipeline.actor)
        while len(result["sizes"]) < MAX_STEPS:
            record = pipeline.step()   # knobs are agreed at the boundary: every rank stops at the same step
            result["sizes"].append(record.batch_size)
            result["gen_sizes"].append(record.generation_batch_sizes)
            result["digests"].append(params_digest(pipeline.actor))
            if result["first_rewards"] is None:
                result["first_rewards"] = record.reward_mean
            if result["sizes"].count(NEW_BATCH) >= 2:
                break
        result["critic_digest"] = params_digest(pipeline.critic)
        result["projections"] = {str(k): v for k, v in pipeline.grads.projections.items()}
        result["grads"] = pipeline.grads.stats
    hook.close()
    torch.distributed.destroy_process_group()
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
