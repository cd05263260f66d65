"""`trimtab verl-tail` reads a JSONL file and posts reports: it needs httpx, not torch. Checked in a fresh
interpreter where torch cannot be imported at all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NO_TORCH = """
import sys


class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy"):
            raise ImportError(f"blocked by the test: {name}")
        return None


sys.meta_path.insert(0, NoTorch())
"""

TAIL = NO_TORCH + """
import json
from trimtab.trainer.adapters.verl import VerlTailer

tailer = VerlTailer(sys.argv[1])
reports = tailer.poll()
print(json.dumps({"steps": [r.step for r in reports], "phases": sorted(reports[0].phases_s), "wire": sorted(reports[0].to_wire()),
                  "torch": "torch" in sys.modules}))
"""


def run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_blocker_really_blocks_torch():
    out = run(NO_TORCH + "import torch\n")
    assert out.returncode != 0 and "blocked by the test: torch" in out.stderr


def test_verl_tail_help_needs_no_torch():
    out = run(NO_TORCH + "from trimtab.cli.main import main\nsys.argv = ['trimtab', 'verl-tail', '--help']\nmain()\n")
    assert out.returncode == 0, out.stderr
    assert "usage: trimtab verl-tail" in out.stdout and "--job" in out.stdout and "--trainer" in out.stdout


def test_tailing_a_verl_jsonl_file_needs_no_torch(tmp_path):
    log = tmp_path / "experiment.jsonl"
    lines = [{"step": step, "data": {"timing_s/step": 2.0, "timing_s/gen": 1.2, "timing_s/update_actor": 0.5,
                                     "perf/total_num_tokens": 4096, "response_length/mean": 96.0,
                                     "prompt_length/mean": 32.0}} for step in (1, 2)]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = run(TAIL, str(log))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["steps"] == [1, 2] and "update" in got["phases"] and "step_time_s" in got["wire"]
    assert got["torch"] is False
