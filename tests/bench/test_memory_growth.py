"""``bench/memory_growth.py`` in its CPU mode (a simulated 141 GiB GPU, 3 GiB per sample): a real `trimtab up`,
the hook, the rebalancer raising the batch from 1 — it must end at the largest batch under trimtab's memory line
with no OOM, each raise's prediction in its decision. The same script runs on the H200 with ``--device-map
cuda:0``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.memory_growth import fit_line

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30


def test_the_fit_of_measured_peaks_is_a_base_and_a_per_sample_slope():
    assert fit_line({1: 5 * GIB, 4: 14 * GIB, 16: 50 * GIB}) == (2 * GIB, 3 * GIB)
    assert fit_line({8: 30 * GIB}) is None


def test_the_cpu_mode_ends_at_the_largest_batch_under_the_memory_line_without_an_oom(tmp_path):
    out = tmp_path / "memory_growth.json"
    proc = subprocess.run([sys.executable, "bench/memory_growth.py", "--device-map", "cpu", "--tiny", "--tail", "20",
                           "--budget-s", "150", "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["ooms"] == 0
    assert summary["per_sample_gib"] == 3.0 and summary["largest_fitting"] == 46
    assert summary["final_batch"] == summary["largest_under_line"] == 42, summary  # (0.92 × 141 − 2) / 3
    raises = [d for d in result["decisions"] if d["knob"] == "batch_size" and d["new_value"] > d["old_value"]]
    assert raises and all("memory_prediction" in d["evidence"] for d in raises)
    assert "predicted GiB | observed GiB" in proc.stdout and "CUDA OOMs: 0" in proc.stdout
