"""``bench/soak.py --servers 2``: the largest N with /metrics < 1 s is found for two `trimtab server`s on one
PostgreSQL schema, each scraped (issue 39: two servers were never measured for N). A tiny run: the bench works,
not its figure."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.bench.test_smoke import REPO
from tests.store.conftest import pg_admin_or_skip


@pytest.mark.parametrize("agents", ["split", "first"])
def test_soak_finds_n_for_two_servers_on_one_postgresql_and_times_each(agents, tmp_path):
    pg_admin_or_skip()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "bench/soak.py", "--db", "postgresql", "--servers", "2", "--agents", agents,
                           "--find-n", "8", "--hours", "0.02", "--repeat", "1", "--before-every", "0"],
                          cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, text=True, timeout=300)
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, output
    [row] = [line for line in proc.stdout.splitlines() if line.split()[:1] == ["8"]]
    per_server = [float(ms) for ms in re.search(r"\[(.*)\]", row).group(1).split(", ")]
    assert len(per_server) == 2 and float(row.split()[3]) == max(per_server), row  # the slowest server's figure
    assert row.split()[1] == "8", row  # the scrape showed every GPU of the fleet (else its time is not the fleet's)
    assert f"(2 servers on one postgresql store, agents {agents}): " in proc.stdout, output
    assert sorted(p.name for p in tmp.iterdir()) == [], "soak.py left these in its TMPDIR"


def test_two_servers_need_postgresql():
    proc = subprocess.run([sys.executable, "bench/soak.py", "--servers", "2", "--find-n", "8"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--servers > 1 needs --db postgresql" in proc.stderr, proc.stderr
