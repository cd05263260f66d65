"""The live view holds the live fleet, not every host name it ever heard from (issue 39)."""

from __future__ import annotations

import pytest

from trimtab.api import live_view
from trimtab.api.live_view import LatestSnapshot
from trimtab.contract.readings import NodeInfo
from tests.store.conftest import make_batch


def test_nodes_and_samples_silent_past_the_bound_leave_the_live_view(monkeypatch):
    clock = [1_800_000_000.0]
    monkeypatch.setattr(live_view.time, "time", lambda: clock[0])
    view = LatestSnapshot(forget_after_s=600)
    for minute in range(60):  # a pod a minute for an hour, each reporting once
        now_ms = int(clock[0] * 1000)
        view.update(make_batch([now_ms], n_gpus=2, node=NodeInfo(hostname=f"pod-{minute}"),
                               uuid_prefix=f"GPU-{minute}-"))
        clock[0] += 60
    assert len(view) <= 600 / 60 + 2  # the pods of the last ten minutes (and a sweep's lag)
    assert {s.node.hostname for s in view.nodes()} >= {f"pod-{m}" for m in range(50, 60)}


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="forget_after_s"):
        LatestSnapshot(forget_after_s=0)
