"""Every script in ``bench/`` runs, at a tiny size, in the suite: a benchmark that no longer runs is a figure nobody
can reproduce (issue 23: ``bench/server_load.py`` read a token file `trimtab server --db …` no longer writes).

``SMOKE`` maps each script to the arguments of its smoke run and a line its output must show. A script that needs
hardware this machine may not have runs the path that needs none (a simulated or stand-in source, ``--dry-run``,
``--help``) and says in ``gpu`` why its real path is not run here. Each run gets a temporary directory of its own
(``TMPDIR``) that must be empty when the script ends: a script cleans up after itself. A new ``bench/*.py`` needs an
entry (the last test fails until it has one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from tests.store.conftest import pg_admin_or_skip

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]
    shows: str | tuple[str, ...]  # a line fragment (or several) the run's stdout must contain
    gpu: Optional[str] = None     # why the script's real path is not run here (it needs GPUs)
    via: Optional[str] = None     # a module of another script's, not run alone: the script whose run exercises it
    postgres: bool = False        # needs the test PostgreSQL (TRIMTAB_TEST_PG_URL): skips without it, as the PG tests


SMOKE = {
    "clock_steps.py": Smoke(("--ticks", "2", "--interval", "0.05"), "its clock is 3600 s behind"),
    "drifting_jobs.py": Smoke(("--smoke",), "% of the static batch"),
    "failing_plan.py": Smoke(("--seconds", "3"), "plans tried"),
    "metrics_render.py": Smoke(("--nodes", "2", "--repeats", "1"), "generate_latest / trimtab's:"),
    "gpu_agreement.py": Smoke(("--help",), "--phase-s",
                              gpu="drives a known load on a real GPU against nvidia-smi dmon: its arguments only"),
    "failover.py": Smoke(("--smoke",), "decisions duplicated: same change 0, same window 0, two pending at once 0",
                         postgres=True),
    "gpu_ledger.py": Smoke(("--smoke",), ("ratio ledger/store", "per scrape: /metrics without", "per tick")),
    "gpu_phases.py": Smoke(("--smoke",), "smoke ok",
                           gpu="phases of known GPU duration need CUDA: here the grading path on wall time only"),
    "head_outage.py": Smoke(("--outage-s", "2", "--warm-s", "1", "--after-s", "2", "--drain-s", "20"),
                            ('"duplicated_rows": 0', '"outage_held": true')),
    "hook_overhead.py": Smoke(("--config", "smoke", "--rounds", "1", "--block", "1", "--warmup", "0", "--daemon"),
                              "mean step (throughput)"),
    "job_curve_models.py": Smoke(("--seeds", "1", "--max-steps", "40", "--workloads", "non_monotone"),
                                 "non-monotone batch curve", via="workloads.py"),
    "job_memory_models.py": Smoke(("--seeds", "1", "--max-steps", "40", "--workloads", "memory"),
                                  "memory-growing", via="workloads.py"),
    "job_models.py": Smoke(("--seeds", "1", "--max-steps", "40", "--workloads", "drift,regimes"), "regime-shifting",
                           via="workloads.py"),
    "job_noise_models.py": Smoke(("--seeds", "1", "--max-steps", "40", "--workloads", "stalls"),
                                 "stalls (sync", via="workloads.py"),
    "job_periodic_models.py": Smoke(("--seeds", "1", "--max-steps", "40", "--workloads", "generation_every_4"),
                                    "generation every 4 steps", via="workloads.py"),
    "job_queue_models.py": Smoke(("--seeds", "1", "--max-steps", "40", "--workloads", "queue_steady"),
                                 "bounded queue, generation-bound", via="workloads.py"),
    "live_api.py": Smoke(("--seeds", "1", "--max-steps", "40", "--workloads", "comm"), "communication-bound",
                         via="workloads.py"),
    "memory_growth.py": Smoke(("--device-map", "cpu", "--tiny", "--max-steps", "4", "--tail", "2", "--budget-s", "10"),
                              "CUDA OOMs: 0"),
    "moving_job.py": Smoke(("--device-map", "cpu", "--smoke"), "of the best static"),
    "moving_gpu.py": Smoke(("--device-map", "cpu", "--live", "--steps", "30", "--step-s", "0.01", "--goal-pct", "0"),
                           "OOMs 0",
                           gpu="real KV allocations on a GPU: here the same path with memory simulated",
                           via="moving_job.py"),
    "nvml_process_window.py": Smoke(("--help",), "--gpu",
                                    gpu="a known duty cycle on a real GPU read through NVML: its arguments only"),
    "nvlink_accounting.py": Smoke(("--dry-run", "--gpus", "0,1"), "phases peer", via="multigpu_nvlink.py"),
    "multigpu_nvlink.py": Smoke(("--dry-run", "--gpus", "0,1"), "phases peer",
                                gpu="moves bytes over NVLink between GPUs: the plan (--dry-run) only"),
    "pipeline_report.py": Smoke(("--dry-run", "--device-map", "cpu", "--world", "2"), "plan: 2 ranks",
                                via="multigpu_pipeline.py"),
    "multigpu_pipeline.py": Smoke(("--dry-run", "--device-map", "cpu", "--world", "2"), "plan: 2 ranks",
                                  gpu="its CPU run (2 gloo ranks) takes ~60 s on 2 busy cores: the plan only; "
                                      "tests/workload/test_pipeline_ddp.py runs the ranks and this script's helpers"),
    "nvml_tick.py": Smoke(("--fake-nvml", "--fake-gpus", "2", "--ticks", "4", "--naive-ticks", "0", "--wait", "sleep",
                           "--hz", "50"), ("ratio ours/bare", "ratio ours/ours without per-process",
                                           "per-process utilization read, off the tick"),
                          gpu="times real NVML calls: here against its stand-in (--fake-nvml)"),
    "_nvml_standin.py": Smoke(("--fake-nvml", "--fake-gpus", "1", "--ticks", "2", "--naive-ticks", "0", "--wait",
                               "sleep", "--hz", "50", "--activity-calls", "3"), "FAKE NVML", via="nvml_tick.py"),
    "_nvml_procutil.py": Smoke(("--fake-nvml", "--fake-gpus", "1", "--ticks", "2", "--naive-ticks", "0", "--wait",
                                "sleep", "--hz", "50", "--activity-calls", "3"),
                               ("nvmlDeviceGetProcessUtilization (one C call)", "cheapest: "), via="nvml_tick.py"),
    "learning_staleness.py": Smoke(("--seeds", "1", "--budget-s", "40"), "stale-hurts: 1/1 rolled back citing a signal"),
    "pipeline_memory.py": Smoke(("--config", "smoke", "--steps", "2", "--every", "1"),
                                "steps in", gpu="the GPU's figures (NVML, torch's allocator): here n/a, the loop runs"),
    "pipeline_ledger.py": Smoke(("--config", "smoke", "--steps", "3"), "GET /v1/jobs/ppo-ledger/gpu-time"),
    "process_activity.py": Smoke(("--help",), "--seconds",
                                 gpu="two CUDA processes on one GPU against the agent's per-process attribution: its "
                                     "arguments only (without a GPU it exits 2 with one line)"),
    "process_estimators.py": Smoke(("--help",), "--seconds", via="process_activity.py"),
    "pipeline_grid.py": Smoke(("--config", "smoke", "--batch-sizes", "1,4", "--prefetch", "0", "--sync-every", "1",
                               "--steps", "1", "--warmup", "0"), "the default"),
    "plan_cost.py": Smoke(("--rates", "21", "--seconds", "2"), "ratio"),
    "pooled_pairs.py": Smoke(("1=90,110", "2=100,100,100", "--draws", "200", "--drop-first", "1"),
                             "4 pairs of 2 runs: mean 102.5 %"),
    "rebalance.py": Smoke(("--config", "smoke", "--best", "4,0,1", "--max-steps", "2", "--best-steps", "1",
                           "--tail", "1", "--budget-s", "3", "--landed-blocks", "1", "--landed-steps", "1",
                           "--control-blocks", "1", "--paired-blocks", "1", "--paired-steps", "1"),
                          ("landed: final setting", "paired: the auto job", "measured right before the auto run")),
    "report_batching.py": Smoke(("--step-ms", "5", "--rounds", "1", "--block", "20"), "paced (default)"),
    "raw_http.py": Smoke(("--smoke",), "planning / idle", via="report_latency.py"),
    "report_latency.py": Smoke(("--smoke",), "planning / idle"),
    "server_load.py": Smoke(("--db", "sqlite", "--nodes", "1,2", "--seconds", "1"), "largest N with 0 drops"),
    "soak.py": Smoke(("--nodes", "1", "--hours", "0.05", "--before-every", "1", "--repeat", "1"),
                     ("slopes", "before 0012 vs now")),
    "soak_before.py": Smoke(("--nodes", "1", "--hours", "0.05", "--before-every", "1", "--repeat", "1"),
                            "before 0012 vs now", via="soak.py"),
    "soak_memory.py": Smoke(("--nodes", "1", "--interval-s", "0.5", "--warm-s", "2", "--run-s", "4"), "grew most"),
    "store_ingest.py": Smoke(("--ticks", "20", "--repeats", "1", "--pg-url", ""), "sqlite"),
    "synthetic_job.py": Smoke(("--seeds", "1", "--max-steps", "40", "--workloads", "comm"),
                              "communication-bound", via="workloads.py"),
    "workloads.py": Smoke(("--seeds", "1", "--max-steps", "40"), "communication-bound"),
}


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_each_bench_script_runs_at_a_tiny_size_and_leaves_no_temporary_files(script, tmp_path):
    smoke = SMOKE[script]
    if smoke.postgres:
        pg_admin_or_skip()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch-cache")}  # torch's own cache, not the script's
    proc = subprocess.run([sys.executable, f"bench/{smoke.via or script}", *smoke.args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    assert "Traceback" not in proc.stderr, output
    for shows in (smoke.shows,) if isinstance(smoke.shows, str) else smoke.shows:
        assert shows in proc.stdout, output
    assert sorted(p.name for p in tmp.iterdir()) == [], f"{script} left these in its TMPDIR"


def test_every_bench_script_has_a_smoke_run():
    scripts = {p.name for p in (REPO / "bench").glob("*.py") if p.name != "__init__.py"}
    assert scripts - set(SMOKE) == set(), "add these scripts to SMOKE (tests/bench/test_smoke.py)"
    assert set(SMOKE) - scripts == set(), "SMOKE names scripts that are gone"
    assert all(s.gpu is None or s.gpu.strip() for s in SMOKE.values())
