"""What the README's opening promises a new user is checked here: it opens with the two commands (the second is the
one CI runs, verbatim), then what trimtab is, then the demo; and the count of Prometheus tests it says skip without
Debian's `prometheus` is the suite's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# Every test in these files runs a real Prometheus (they skip, saying why, without one).
PROMETHEUS_TEST_FILES = ("tests/grafana/test_promql_queries.py", "tests/api/metrics/test_prometheus_scrape.py")


def opening_commands() -> list[str]:
    block = re.search(r"\A# trimtab\n\n```sh\n(.*?)```", README, re.S)
    assert block, "the README opens with a shell block right under its title"
    return block.group(1).splitlines()


def test_the_readme_opens_with_two_commands_then_what_trimtab_is_then_the_demo():
    lines = opening_commands()
    assert lines[:2] == ["pip install . && trimtab up", "python3 -m pip install -e '.[dev]' && python3 -m pytest"]
    assert all(line.startswith("# ") for line in lines[2:])  # anything more is advice, never a third command
    assert "download.pytorch.org/whl/cpu" in "\n".join(lines[2:])  # the CPU torch, before the test command pulls CUDA
    after = README.split("```", 2)[2].lstrip("\n")
    first_paragraph, rest = after.split("\n\n", 1)
    assert first_paragraph.startswith("trimtab keeps multi-GPU RL post-training jobs")
    assert rest.startswith("## The demo\n")


def test_ci_runs_the_readmes_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert opening_commands()[1] in ci.splitlines()


def test_the_readme_counts_the_prometheus_tests_right():
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                *PROMETHEUS_TEST_FILES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    n = sum("::" in line for line in collected.stdout.splitlines())
    assert n > 0, collected.stdout + collected.stderr
    said = re.search(r"the (\d+) Prometheus tests", " ".join(README.split()))
    assert said and int(said.group(1)) == n, f"the README says {said and said.group(1)}; the suite has {n}"
