"""An ApiContext on a real, migrated SQLite store, fed the way `trimtab up` feeds it: every batch a sampler
produces goes to the in-memory snapshot and to the store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trimtab.contract.readings import Batch
from trimtab.agent.sampler import Sampler
from trimtab.agent.simulated import SimulatedNode
from trimtab.api.context import ApiContext
from trimtab.api.metrics import render_metrics
from trimtab.store.engine import open_engine
from trimtab.store.ingest import BatchWriter
from trimtab.store.migrate import migrate


class Feeder:
    """Hands batches to the snapshot (a local agent or ingest) and/or the store (an agent writing to it directly)."""

    def __init__(self, ctx: ApiContext, snapshot: bool = True, store: bool = True):
        self.ctx = ctx
        self.snapshot = snapshot
        self.writer = BatchWriter(ctx.engine) if store else None

    def __call__(self, batch: Batch) -> Batch:
        if self.snapshot:
            self.ctx.snapshot.update(batch)
        if self.writer is not None:
            self.writer.write(batch)
        return batch

    def simulated(self, hostname: str = "sim-a", scenario: str = "actor-hot", n_gpus: int = 4, ticks: int = 3) -> Batch:
        """``ticks`` real sampler ticks of a simulated node; returns the last batch (what the snapshot holds)."""
        sampler = Sampler([SimulatedNode(n_gpus, scenario, hostname=hostname)], self, hostname=hostname)
        return [sampler.tick() for _ in range(ticks)][-1]


def _context(tmp_path: Path, mode: str, migrated: bool = True) -> ApiContext:
    engine = open_engine(f"sqlite:///{tmp_path}/trimtab.db")
    if migrated:
        migrate(engine)
    return ApiContext(engine=engine, mode=mode, state_dir=tmp_path)


@pytest.fixture
def ctx(tmp_path):
    ctx = _context(tmp_path, "up")
    yield ctx
    ctx.engine.dispose()


@pytest.fixture
def make_ctx(tmp_path):
    made = []

    def make(mode: str = "up", migrated: bool = True) -> ApiContext:
        made.append(_context(tmp_path / f"ctx{len(made)}", mode, migrated))
        return made[-1]

    yield make
    for c in made:
        c.engine.dispose()


@pytest.fixture
def feed(ctx):
    return Feeder(ctx)


def scrape(ctx: ApiContext, nvlink_links: Optional[bool] = None) -> dict[str, list]:
    """Render and parse back: sample name → [(labels, value)]. Parsing is part of the test: it must be valid."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(render_metrics(ctx, nvlink_links).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def by_uuid(samples: list) -> dict[str, float]:
    return {labels["UUID"]: value for labels, value in samples}
