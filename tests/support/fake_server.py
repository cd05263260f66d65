"""A stand-in for trimtab's API inside the hook's HTTP client (an httpx MockTransport handler), for the tests of
the reporter's fail-open behaviour and of its batches (tests/trainer/test_hook_failopen.py,
tests/trainer/test_reporter_batching.py)."""

from __future__ import annotations

import json
import threading

import httpx


class FakeServer:
    """An httpx MockTransport handler standing in for the API; ``mode`` says how it misbehaves ("down": nothing
    listens, a connection error; "old": a server without the batch route, which FastAPI answers 404 "Not Found";
    "old405": 405 "Method Not Allowed").
    ``bad_steps``: reports it refuses (422), a batch holding one whole. ``gate``: while set, each request waits
    for it to open (the reporter thread is held inside its request while the test queues reports)."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.pending: list = []
        self.delivered: set[int] = set()  # steps whose report got a proper answer
        self.requests: list[tuple[str, str, dict]] = []
        self.bad_steps: set[int] = set()
        self.gate: threading.Event | None = None
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.mode == "down":  # nothing listens: the request never reaches a server (not recorded)
            raise httpx.ConnectError("connection refused", request=request)
        body = json.loads(request.content) if request.content else {}
        with self.lock:
            self.requests.append((request.method, request.url.path, body))
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        if request.method == "GET":
            return httpx.Response(404, json={"detail": "no job"})
        if request.url.path == "/v1/jobs":
            return httpx.Response(201, json={"name": body["name"]})
        if self.mode == "garbage":
            return httpx.Response(200, text="<html>proxy error</html>")
        if self.mode == "5xx":
            return httpx.Response(503, text="upstream unavailable")
        if self.mode == "422":
            return httpx.Response(422, json={"detail": [{"loc": ["body", "step"], "msg": "bad"}]})
        batch = request.url.path.endswith("/report-batches")
        if batch and self.mode in ("old", "old405"):
            return httpx.Response(404, json={"detail": "Not Found"}) if self.mode == "old" else httpx.Response(
                405, json={"detail": "Method Not Allowed"}, headers={"Allow": "GET"})
        reports = body["reports"] if batch else [body] if request.url.path.endswith("/reports") else []
        if self.mode == "forgot" and reports:
            self.mode = "ok"  # a fresh store: it knows nothing until the job registers again
            return httpx.Response(404, json={"detail": "no job named 'fake'"})
        bad = [i for i, r in enumerate(reports) if r["step"] in self.bad_steps]
        if bad:
            loc = ["body", "reports", bad[0], "step_time_s"] if batch else ["body", "step_time_s"]
            return httpx.Response(422, json={"detail": [{"loc": loc, "msg": "bad", "type": "value_error"}]})
        self.delivered.update(r["step"] for r in reports)
        stored = {"stored": len(reports), "received": len(reports)} if batch else {"stored": True}
        return httpx.Response(200, json={**stored, "pending_changes": self.pending})

    def posted(self, suffix: str) -> list[dict]:
        with self.lock:
            return [b for m, p, b in self.requests if m == "POST" and p.endswith(suffix)]


def messages(caplog, word: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if word in r.getMessage()]


def delivered_in_order(server: FakeServer) -> list[int]:
    """The steps of every report the server took, in the order they came (single and batched POSTs)."""
    with server.lock:
        posts = [(p, b) for m, p, b in server.requests if m == "POST"]
    steps: list[int] = []
    for path, body in posts:
        if path.endswith("/report-batches"):
            steps += [r["step"] for r in body["reports"]]
        elif path.endswith("/reports"):
            steps.append(body["step"])
    return steps


class ByHost:
    """One httpx MockTransport handler for several fake servers, by the request's host (``{"a.invalid": …}``)."""

    def __init__(self, servers: dict[str, FakeServer]):
        self.servers = servers

    def __call__(self, request: httpx.Request) -> httpx.Response:
        return self.servers[request.url.host](request)
