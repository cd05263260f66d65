"""A report, a batch of reports and an ack each take one hand-off to the thread pool, not two (issue 39).

A ``def`` route runs on the pool and FastAPI then checks its response on the pool too: a second hand-off per report.
On a machine whose cores are busy each hand-off waits for the kernel to run the thread that takes over (with the
server's interpreter lock idle meanwhile): report_latency.py's time from the route's call to a pool thread starting
it reached p99 87-183 ms with two CPU burners. The hot routes are ``async def`` and hand their store work to the pool
once; their responses are checked on the event loop. Counted here where every hand-off goes: anyio's ``run_sync``.
"""

from __future__ import annotations

import anyio.to_thread
import pytest

from tests.api.test_jobs import JOB, REPORT


@pytest.fixture
def handoffs(monkeypatch):
    """Each call to ``anyio.to_thread.run_sync`` (starlette's and FastAPI's way to the thread pool), by function."""
    calls: list[str] = []
    real = anyio.to_thread.run_sync

    async def counted(func, *args, **kwargs):
        calls.append(getattr(func, "__qualname__", None) or getattr(getattr(func, "func", None), "__qualname__", "?"))
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    return calls


def test_a_report_a_batch_and_an_ack_each_hand_off_to_the_thread_pool_once(sqlite_api, handoffs):
    api = sqlite_api
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    change = api.post("/v1/jobs/grpo-7b/changes", {"knob": "batch_size", "value": 16, "reason": "test"},
                      scope="admin").json()
    api.token("job")  # (the token's creation is a write of its own: not counted below)
    for path, body in (("/v1/jobs/grpo-7b/reports", REPORT),
                       ("/v1/jobs/grpo-7b/report-batches", {"reports": [{**REPORT, "step": 11}, {**REPORT, "step": 12}]}),
                       ("/v1/jobs/grpo-7b/acks", {"change_id": change["change_id"], "rank": 0, "applied_at_step": 12})):
        handoffs.clear()
        r = api.post(path, body, scope="job")
        assert r.status_code == 200, r.text
        assert len(handoffs) == 1, f"{path}: {len(handoffs)} hand-offs to the thread pool: {handoffs}"
    assert api.get("/v1/jobs/grpo-7b/reports", limit=10).json()["reports"][0]["step"] == 12  # stored, as before

