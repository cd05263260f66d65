"""Fixtures of the agent tests: the NVML source over a fake pynvml (error paths only)."""

from __future__ import annotations

import sys

import pytest

from tests.agent import fake_pynvml as fk
from trimtab.agent.nvml import NvmlSource


@pytest.fixture
def install(monkeypatch):
    """install(fake) → an NvmlSource over the fake; closed at the end of the test."""
    opened = []

    def _install(fake: fk.FakeNvml, **kwargs) -> NvmlSource:
        monkeypatch.setitem(sys.modules, "pynvml", fake.module)
        kwargs.setdefault("slow_refresh_s", None)  # tests drive the slow refresh themselves
        kwargs.setdefault("activity_every_s", None)  # and the per-process utilization reads
        source = NvmlSource(**kwargs)
        opened.append(source)
        return source

    yield _install
    for source in opened:
        source.close()
