"""Fixtures shared by the trainer tests: one local Ray for every verl test of the session."""

from __future__ import annotations

import pytest

from tests.support.frameworks import require

from trimtab.control.service import Rebalancer
from trimtab.grading.rules import load_rules


@pytest.fixture(autouse=True)
def hook_spool_in_tmp(tmp_path, monkeypatch):
    """A hook that spools its reports (a server away) does so under the test's tmp dir, not the state directory."""
    monkeypatch.setenv("TRIMTAB_HOOK_SPOOL_DIR", str(tmp_path / "hook-spool"))


@pytest.fixture(scope="session")
def verl_ray():
    """One ``ray.init(num_cpus=2, include_dashboard=False)`` for the whole session (``verl_harness._ensure_ray``:
    the V1/legacy harness starts it the same way on first use, so every verl test shares this one start)."""
    require("verl")
    from tests.trainer import verl_harness

    verl_harness._ensure_ray()
    yield


@pytest.fixture
def served(make_api, tmp_path):
    """A live API whose rebalancer uses ``rules`` (set by the test) — as in `trimtab up`."""
    api = make_api("sqlite")
    holder = {}

    def start(rules=None) -> Rebalancer:
        rb = Rebalancer(api.ctx.engine, rules or load_rules(), interval_s=0.2).start()
        api.ctx.after_report, api.ctx.after_refusal = rb.after_report, rb.after_refusal
        holder["rb"] = rb
        return rb

    yield api, start
    if "rb" in holder:
        holder["rb"].stop()
