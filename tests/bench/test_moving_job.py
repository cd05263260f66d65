"""``bench/moving_job.py``: the moving job (lengths 256 → 1024 over 300 steps, KV-like memory per token) under the
rebalancer. On the CPU (simulated memory and time) it must follow the length with no OOM and beat the best static
batch by the margin issue 20 asks of the H200 (≥ 150 %); the H200 path (`trimtab up`, the hook, real steps) runs
here with the memory simulated, for its plumbing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.moving_job import Run, Shape, SimJob, baselines, largest_fitting, ooms_by_cause

REPO = Path(__file__).resolve().parents[2]


def test_the_static_batch_fits_the_longest_length_and_the_oracle_each_steps_own():
    job = SimJob(Shape(), seed=3)
    base = baselines(job)
    lengths = job.lengths()
    assert job.fits(base["static_batch"], max(lengths)) and not job.fits(base["static_batch"] + 1, max(lengths))
    assert all(job.fits(b, n) and not job.fits(b + 1, n) for b, n in zip(base["oracle_batches"], lengths))
    assert base["oracle_samples_per_s"] > 1.5 * base["static_samples_per_s"]
    assert largest_fitting(lambda b, n: b * n <= 1000, 100, 64) == 10 and largest_fitting(lambda b, n: False, 1, 8) == 0


def test_an_oom_is_charged_to_a_raise_when_the_batch_last_went_up_and_to_growth_when_it_last_went_down():
    run = Run(batches=[4, 16, 16, 12, 12, 12, 20, 20], ooms=[2, 5, 7])
    assert ooms_by_cause(run) == {"raise": 2, "growth": 1}


def test_the_cpu_smoke_follows_the_length_without_an_oom_above_150_pct_of_the_best_static(tmp_path):
    out = tmp_path / "moving.json"
    proc = subprocess.run([sys.executable, "bench/moving_job.py", "--device-map", "cpu", "--smoke", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [result] = json.loads(out.read_text())
    assert result["ooms"] == 0 and result["of_static_pct"] >= 150.0, result
    # a batch bound by memory follows its line both ways (control/memory_follow.py): its lowers as the length grows
    lowers = [d for d in result["decisions"] if d["rule"] == "memory_forecast" and d["change"][1] < d["change"][0]]
    # all kept; the newest may still be waiting for its verdict (or its step) when the run's steps run out
    assert len(lowers) >= 5 and all(d["outcome"] == "kept" for d in lowers[:-1])
    assert lowers[-1]["outcome"] in ("kept", "pending")
    assert all(d["memory"]["tokens_per_sample_at"] >= d["memory"]["tokens_per_sample_now"] for d in lowers)
    batches = [p["batch"] for p in result["path"]]
    assert max(batches) > 2 * result["static_batch"] and batches[-1] <= result["static_batch"]


def test_the_gpu_path_runs_on_the_cpu_under_trimtab_up(tmp_path):
    out = tmp_path / "live.json"
    proc = subprocess.run([sys.executable, "bench/moving_job.py", "--device-map", "cpu", "--live", "--steps", "30",
                           "--step-s", "0.01", "--baseline-every", "10", "--goal-pct", "0", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["steps"] == 30 and result["ooms"] == 0 and result["static_batch"] == 27
    assert "trimtab up at http://127.0.0.1:" in proc.stdout and "'dropped': 0" in proc.stdout
