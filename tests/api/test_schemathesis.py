"""schemathesis ``st run --checks all`` — every phase (examples, coverage, fuzzing, stateful links) — against the
live server, on SQLite and on PostgreSQL, as an admin and anonymously, each run with its own seed: it must find
nothing. The one narrowed check (a 422 for a rule beyond any schema) and why: tests/api/st_hooks.py.

The CLI runs as a child process (the way a user runs it) against the fixture's server on a loopback port; a
failure prints schemathesis' own report, with a curl line and ``st replay`` id for each finding.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.frameworks import require

require("schemathesis")

from tests.api.conftest import SIM_NODE, recent_batch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MAX_EXAMPLES = 8  # per operation and phase (the coverage phase adds its own boundary cases): ~25 s a run
# Anonymous runs skip the coverage phase: its boundary values would only meet the 401 of every write again.
PHASES = {"admin": "examples,coverage,fuzzing,stateful", "anonymous": "examples,fuzzing,stateful"}
SEEDS = {("sqlite", "admin"): 1, ("sqlite", "anonymous"): 2, ("postgresql", "admin"): 3,
         ("postgresql", "anonymous"): 4}


def _seed(api) -> None:
    """A node, GPUs and a job, so that reads and the job routes have something real to find."""
    assert api.ingest(recent_batch(SIM_NODE)).status_code == 200
    job = {"name": "job-a", "ranks": 2, "hostnames": [SIM_NODE.hostname], "device_map": {"actor": [0], "critic": [1]},
           "knobs": {"batch_size": {"value": 8, "min": 1, "max": 64}, "prefetch": {"value": 1, "min": 0, "max": 8}}}
    assert api.post("/v1/jobs", job, scope="job").status_code == 201


@pytest.mark.parametrize("who", ["admin", "anonymous"])
def test_schemathesis_with_every_check_finds_nothing(api, who, tmp_path):
    _seed(api)
    store = api.ctx.engine.dialect.name
    args = [sys.executable, "-m", "schemathesis.cli", "run", f"{api.url}/openapi.json", "--checks", "all",
            "--exclude-checks", "positive_data_acceptance",  # replaced by positive_data_acceptance_beyond_schema
            "--seed", str(SEEDS[store, who]), "--max-examples", str(MAX_EXAMPLES), "--phases", PHASES[who],
            "--no-color",
            "--request-timeout", "20"]
    if who == "admin":
        # Revoking tokens at random would revoke the run's own admin token; revocation has tests of its own.
        args += ["-H", f"Authorization: Bearer {api.admin_token}", "--exclude-method", "DELETE",
                 "--exclude-path-regex", "^/v1/tokens/"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.st_hooks", "PYTHONPATH": str(REPO),
           "HOME": str(tmp_path)}  # schemathesis keeps its example database under the home directory
    started = time.monotonic()
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-20000:]
    assert "No issues found" in report or "passed" in report, report[-3000:]
    assert time.monotonic() - started < 90, "keep the suite's schemathesis part within its budget"
