"""The sink that ships the agent's batches to a `trimtab server` over HTTP. The :class:`~trimtab.contract.sink.Sink`
protocol and the ways a sink says no live in the contract (``trimtab.contract.sink``); the sink into a store the
agent writes itself lives with the store (``trimtab.store.sink``).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional, Sequence, Union

from trimtab.contract.readings import Batch
from trimtab.contract.servers import answer_detail, server_urls
from trimtab.contract.sink import BatchRefused, SinkMisconfigured, SinkUnavailable

log = logging.getLogger("trimtab.agent")


PRIMARY_RETRY_S = 10.0  # while shipping to a later server, how often the first one is tried again
CONNECT_TIMEOUT_S = 3.0  # a server that does not accept the connection this fast is skipped for the next one


class HttpSink:
    """Ships batches to a `trimtab server` over HTTP (``POST /v1/ingest`` with a bearer token of scope ``agent``).

    Each batch says when it was sent by this node's clock (``sent_ms``): the server's clock minus that is the
    node's skew, which it shows. Connection errors, timeouts, 429 and 5xx mean "not now" (spool and retry);
    401/403 (the token) and 404 (no ingest at that URL) mean the configuration is wrong
    (:class:`SinkMisconfigured`); 413/422 mean this batch is, so the writer keeps it aside and says why.

    Given several servers (several heads on one PostgreSQL, issue 39), a batch that one cannot take now goes to the
    next, in the order given; while a later one is in use the first is tried again every ``primary_retry_s`` and
    shipping returns to it once it answers. Only when none can take it does the batch spool. A batch sent again to
    another server after a timeout cannot be stored twice: ingest ignores a sample it already has.
    """

    def __init__(self, server_url: Union[str, Sequence[str]], token: Optional[str], timeout_s: float = 10.0,
                 primary_retry_s: float = PRIMARY_RETRY_S,
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000):
        import httpx

        self._clock_ms = clock_ms  # this node's wall clock (injectable: bench/clock_steps.py steps it)
        self.servers = server_urls(server_url)
        if not self.servers:
            raise ValueError("no server URL given")
        self.description = "server " + self.servers[0] + (
            f" (then {', '.join(self.servers[1:])})" if len(self.servers) > 1 else "")
        self.primary_retry_s = primary_retry_s
        self.active = 0  # the index of the server batches go to now
        self.failovers = 0  # how many times shipping moved to another server
        self._primary_tried = 0.0  # time.monotonic() the first server was last tried while another was in use
        headers = {"Content-Type": "application/json", "User-Agent": "trimtab-agent"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S))

    @property
    def url(self) -> str:  # where the next batch goes
        return self.servers[self.active] + "/v1/ingest"

    def _order(self) -> list[int]:
        """The servers to try for the next batch: the one in use, then the others in their order; the first one
        ahead of them all when it is due another try."""
        n = len(self.servers)
        order = [(self.active + k) % n for k in range(n)]
        if self.active != 0 and time.monotonic() - self._primary_tried >= self.primary_retry_s:
            self._primary_tried = time.monotonic()
            order = [0] + [i for i in order if i != 0]
        return order

    def write(self, batch: Batch) -> int:
        body, failures = batch.to_json(sent_ms=self._clock_ms()), []
        for i in self._order():
            try:
                inserted = self._post(self.servers[i], body)
            except SinkUnavailable as exc:
                failures.append(f"{self.servers[i]}: {exc}")
                continue
            if i != self.active:
                log.warning("shipping to %s now (%s)", self.servers[i],
                            "the first server is back" if i == 0 else "; ".join(failures) or "failover")
                if i != 0:
                    self.failovers += 1
                    self._primary_tried = time.monotonic()  # it just failed: next try in primary_retry_s
                self.active = i
            return inserted
        raise SinkUnavailable("; ".join(failures))

    def _post(self, server: str, body: str) -> int:
        import httpx

        try:
            resp = self._client.post(server + "/v1/ingest", content=body)
        except httpx.HTTPError as exc:  # refused, reset, timeout, DNS
            raise SinkUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code == 429 or resp.status_code >= 500:
            raise SinkUnavailable(f"HTTP {resp.status_code}: {resp.text[:200]}")
        if resp.status_code in MISCONFIGURED_HTTP:
            raise SinkMisconfigured(f"server {server} answered HTTP {resp.status_code} ({answer_detail(resp)}): "
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



