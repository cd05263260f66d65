"""bench/nvml_tick.py finishes within its budget and shows how far it got as it goes: on an H100 its old defaults
(200 ticks a side, both wait modes: 128 s of pacing, all output at the end) printed nothing within an 80 s limit.
Here against its NVML stand-in, piped (block-buffered stdout, as a remote run captures it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_a_run_stops_at_its_budget_and_prints_progress_as_it_goes():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "bench/nvml_tick.py", "--fake-nvml", "--fake-gpus", "1", "--ticks", "1000",
                           "--naive-ticks", "0", "--budget-s", "3"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    took_s = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert took_s < 30, took_s  # 1000 ticks a side would take 2 × 316 s
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("nvml_tick: ")]
    assert "about 633 s of ticks (at most 3 s)" in lines[0]
    assert any("wait=sleep:" in ln and "(cut short by --budget-s)" in ln for ln in lines)
    assert any(ln.startswith("nvml_tick: wait=spin: 0 ticks a side (cut short") for ln in lines)
    assert "ratio ours/bare" in proc.stdout


def test_the_default_run_is_under_a_minute():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nvml_tick_bench", REPO / "bench" / "nvml_tick.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = module.build_parser().parse_args([])
    modes = 2 if args.wait == "both" else 1
    ticks_s = modes * 3 * (args.ticks + 2) / args.hz  # the paced ticks, all sides and wait modes
    # the rest (start-up, each call alone 100 times, 20 naive ticks of ~42 ms a GPU) is a few seconds on one GPU
    assert ticks_s <= args.budget_s <= 45 and args.naive_ticks / args.hz < 5


def test_without_a_gpu_it_exits_2_with_one_line():
    from trimtab.agent.nvml import NvmlSource
    from trimtab.agent.source import SourceUnavailable

    try:
        NvmlSource(activity_every_s=None).close()
        pytest.skip("NVML answers on this machine: the no-GPU path is not taken")
    except SourceUnavailable:
        pass
    proc = subprocess.run([sys.executable, "bench/nvml_tick.py", "--ticks", "1"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("nvml_tick: cannot measure here")
