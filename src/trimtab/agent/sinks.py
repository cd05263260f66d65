"""The sink that ships the agent's batches to a `trimtab server` over HTTP. The :class:`~trimtab.contract.sink.Sink`
protocol and the ways a sink says no live in the contract (``trimtab.contract.sink``); the sink into a store the
agent writes itself lives with the store (``trimtab.store.sink``).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from trimtab.contract.readings import Batch
from trimtab.contract.sink import BatchRefused, SinkMisconfigured, SinkUnavailable


class HttpSink:
    """Ships batches to a `trimtab server` over HTTP (``POST /v1/ingest`` with a bearer token of scope ``agent``).

    Each batch says when it was sent by this node's clock (``sent_ms``): the server's clock minus that is the
    node's skew, which it shows. Connection errors, timeouts, 429 and 5xx mean "not now" (spool and retry);
    401/403 (the token) and 404 (no ingest at that URL) mean the configuration is wrong
    (:class:`SinkMisconfigured`); 413/422 mean this batch is, so the writer keeps it aside and says why.
    """

    def __init__(self, server_url: str, token: Optional[str], timeout_s: float = 10.0,
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000):
        import httpx

        self._clock_ms = clock_ms  # this node's wall clock (injectable: bench/clock_steps.py steps it)
        self.url = server_url.rstrip("/") + "/v1/ingest"
        self.description = f"server {server_url.rstrip('/')}"
        headers = {"Content-Type": "application/json", "User-Agent": "trimtab-agent"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(headers=headers, timeout=timeout_s)

    def write(self, batch: Batch) -> int:
        import httpx

        try:
            resp = self._client.post(self.url, content=batch.to_json(sent_ms=self._clock_ms()))
        except httpx.HTTPError as exc:  # refused, reset, timeout, DNS
            raise SinkUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code == 429 or resp.status_code >= 500:
            raise SinkUnavailable(f"HTTP {resp.status_code}: {resp.text[:200]}")
        if resp.status_code in MISCONFIGURED_HTTP:
            raise SinkMisconfigured(f"{self.description} answered HTTP {resp.status_code} ({_detail(resp)}): "
                                    f"{MISCONFIGURED_HTTP[resp.status_code]}")
        if resp.status_code >= 400:
            raise BatchRefused(f"HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return int(resp.json().get("inserted", 0))
        except (ValueError, AttributeError):
            return 0

    def maintenance(self, now_ms: int) -> None:
        """The server owns its store's upkeep."""

    def close(self) -> None:
        self._client.close()


MISCONFIGURED_HTTP = {
    401: "the server does not know this token (mistyped, revoked, or made for another store): "
         "create one with `trimtab token create --scope agent` on the server's store and pass it with --token-file",
    403: "this token may not ingest: the agent needs a token of scope 'agent' (or 'admin')",
    404: "no trimtab ingest at this URL: --server takes the server's base URL, e.g. http://head:9460",
}


def _detail(resp) -> str:
    """The API's own ``detail`` of an error answer (else the body's start), on one line."""
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return " ".join(str(detail if detail is not None else resp.text).split())[:200]

