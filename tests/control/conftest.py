"""Fixtures of the control loop's tests: a migrated SQLite store, and the rebalancer wired into the live API."""

from __future__ import annotations

import pytest

from trimtab.control.service import Rebalancer
from trimtab.store.engine import open_engine
from trimtab.store.migrate import migrate


@pytest.fixture
def sqlite_engine(tmp_path):
    engine = open_engine(f"sqlite:///{tmp_path}/trimtab.db")
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def rebalancer(sqlite_api):
    """The rebalancer as the daemon wires it (its own planning thread); no sweep: only reports queue plans."""
    rb = Rebalancer(sqlite_api.ctx.engine, sqlite_api.ctx.rules, interval_s=3600).start()
    sqlite_api.ctx.after_report, sqlite_api.ctx.after_refusal = rb.after_report, rb.after_refusal
    yield rb
    rb.stop()


@pytest.fixture
def loop_api(sqlite_api, rebalancer):
    return sqlite_api
