"""``bench/rebalance.py --deadline-s``: past it no paired, landed or control block is begun and the summary still
prints (the H200's run 15 hit its 10-minute call limit in its last landed block on a slow host and printed
nothing, its figures then read back from the step lines of its log)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_past_the_deadline_the_optional_blocks_are_skipped_and_said_and_the_summary_prints(tmp_path):
    args = ["--config", "smoke", "--best", "4,0,1", "--max-steps", "2", "--best-steps", "1", "--tail", "1",
            "--budget-s", "3", "--landed-blocks", "1", "--landed-steps", "1", "--paired-blocks", "2",
            "--paired-steps", "1", "--control-blocks", "1", "--deadline-s", "0.01", "--json", str(tmp_path / "r.json")]
    proc = subprocess.run([sys.executable, "bench/rebalance.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={"PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path),
                                            **{k: v for k, v in __import__("os").environ.items() if k != "TMPDIR"}})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for what in ("paired blocks 1–2", "the landed blocks", "control block 1"):
        assert f"0.01: {what} not measured" in proc.stdout
    assert "is the best static setting itself" not in proc.stdout  # skipped, not "nothing to alternate"
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert summary["paired"] is None and summary["landed"] is None and summary["control_blocks_samples_per_s"] == []
    assert summary["auto_steps"] == 2
