"""The hook's link to the server (``Reporter``), its only network path: a background thread that registers the job,
posts step reports and acks, and hands the server's pending knob changes to the hook.

Fail-open by construction: the training thread only appends to a bounded in-memory queue (``submit`` never
waits, never raises on a network problem); the thread retries with exponential backoff, drops the oldest
reports once the queue is full (counted), says once that the server is offline and once that it is back, and
re-registers when the server answers 404 (it forgot the job: a fresh store, a restart from scratch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

import httpx

from trimtab.contract.knobs import ChangeAck, ChangeRefusal

log = logging.getLogger("trimtab.trainer")

OK, RETRY, DROP, UNKNOWN_JOB = "ok", "retry", "drop", "unknown_job"
RETRY_STATUSES = {401, 403, 408, 425, 429}  # auth may be fixed by an admin; the others are transient


class Reporter:
    """Posts reports for ``job`` to ``server`` from its own thread.

    ``registration``: the ``POST /v1/jobs`` body this reporter declares (rank 0 of a job), or None (other ranks
    only post; rank 0 registers). ``register_if_missing``: declare only if the server does not know the job yet
    (a log tailer must not overwrite the knobs a hook inside the job declared). ``on_pending`` receives each
    successful report response's ``pending_changes`` list (rank 0 only).
    """

    def __init__(self, server: str, job: str, token: Optional[str] = None, *,
                 registration: Optional[dict] = None, register_if_missing: bool = False,
                 on_pending: Optional[Callable[[list], None]] = None, queue_max: int = 256,
                 timeout_s: float = 1.0, backoff_max_s: float = 5.0,
                 transport: Optional[httpx.BaseTransport] = None):
        self.server, self.job = server.rstrip("/"), job
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._registration = registration
        self._register_if_missing = register_if_missing
        self._need_register = registration is not None
        self._registration_gen = 0
        self._registered_at_s = float("-inf")
        self._on_pending = on_pending
        self._timeout = httpx.Timeout(timeout_s)
        self._backoff_max_s = backoff_max_s
        self._transport = transport
        self._lock = threading.Lock()
        self._reports: deque = deque()
        self._acks: deque = deque()
        self._queue_max = queue_max
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flush_deadline = float("inf")
        self.offline = False
        self.sent = self.dropped = self.rejected = 0
        self._said: set[str] = set()  # one-time log lines already written
        self._thread = threading.Thread(target=self._run, name=f"trimtab-reporter-{job}", daemon=True)
        self._thread.start()

    # -- the training thread's side: cheap, never blocks on the network --------------------------------------

    def submit(self, report: dict) -> None:
        with self._lock:
            if len(self._reports) >= self._queue_max:
                self._reports.popleft()
                self.dropped += 1
            self._reports.append(report)
        self._wake.set()

    def ack(self, change_id: int, applied_at_step: int, rank: int) -> None:
        with self._lock:
            self._acks.append(("acks", ChangeAck(int(change_id), int(applied_at_step), int(rank)).to_wire()))
        self._wake.set()

    def refuse(self, change_id: int, rank: int, reason: str) -> None:
        """Tell the server the knob's owner could not apply the change (it closes the decision as refused)."""
        refusal = ChangeRefusal(int(change_id), int(rank), str(reason)).to_wire()
        with self._lock:
            self._acks.append(("refusals", refusal))
        self._wake.set()

    def update_registration(self, registration: dict) -> None:
        """Declare again (new bounds after an OOM); pending changes the new bounds forbid are cancelled."""
        with self._lock:
            self._registration = registration
            self._registration_gen += 1
            self._need_register = True
        self._wake.set()

    def close(self, timeout_s: float = 2.0) -> None:
        """Sends what is queued for at most ``timeout_s`` (giving up at the first failure), then stops."""
        self._flush_deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s + 1.5)

    @property
    def queued(self) -> int:
        return len(self._reports) + len(self._acks)

    # -- the reporter thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff_s = 0.0
        with httpx.Client(base_url=self.server, headers=self._headers, timeout=self._timeout,
                          transport=self._transport) as http:
            while True:
                if self._stop.is_set():
                    # Flushing: keep going while the server answers (a 404 before rank 0 registered is fine),
                    # but not past the deadline and not once it is unreachable: close() must not hang a job.
                    left_s = self._flush_deadline - time.monotonic()
                    if left_s <= 0 or self.offline or not self._has_work():
                        return
                    time.sleep(min(backoff_s, left_s))
                elif backoff_s > 0 and self._stop.wait(backoff_s):
                    continue  # close() came during the wait: the flushing rules above decide
                try:
                    outcome = self._register(http) if self._need_register else self._send_next(http)
                except Exception:  # a bug here must not end the thread: the job would go silent for good
                    self._say("bug", logging.ERROR, "trimtab: reporter error (retrying)", exc_info=True)
                    outcome = RETRY
                if outcome is None:  # nothing queued
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                backoff_s = min(self._backoff_max_s, max(0.1, backoff_s * 2)) if outcome == RETRY else 0.0

    def _has_work(self) -> bool:
        return bool(self._reports or self._acks or self._need_register)

    def _send_next(self, http: httpx.Client) -> Optional[str]:
        with self._lock:
            if self._acks:
                kind, item = self._acks.popleft()
            elif self._reports:
                kind, item = "reports", self._reports.popleft()
            else:
                return None
        outcome, body = self._post(http, f"/v1/jobs/{self.job}/{kind}", item,
                                   expect_pending=(kind == "reports"))
        if outcome == OK:
            self.sent += 1
            if kind == "reports" and self._on_pending is not None and body["pending_changes"]:
                self._on_pending(body["pending_changes"])
        elif outcome == UNKNOWN_JOB and kind != "reports":
            self._say("ack404", logging.WARNING, "trimtab: the server does not know change %s of job %s; "
                      "the %s is dropped", item["change_id"], self.job, kind[:-1])
        elif outcome == UNKNOWN_JOB:
            self._requeue(kind, item)
            if self._registration is None:
                return RETRY  # another rank registers the job; wait for it
            self._need_register = True
            # Re-register at once, unless we just did and the server still says 404: then do not hammer it.
            return RETRY if time.monotonic() - self._registered_at_s < 1.0 else OK
        elif outcome == DROP:
            self.rejected += 1
        else:
            self._requeue(kind, item)
        return outcome

    def _requeue(self, kind: str, item: dict) -> None:
        with self._lock:
            if kind != "reports":
                self._acks.appendleft((kind, item))
                return
            if len(self._reports) >= self._queue_max:
                self.dropped += 1  # the newer reports that arrived meanwhile are worth more
                return
            self._reports.appendleft(item)

    def _register(self, http: httpx.Client) -> str:
        with self._lock:
            body, gen = dict(self._registration), self._registration_gen
        if body.get("mode") is None or self._register_if_missing:
            # Keep the mode an admin set (re-registering with the default would silently turn "auto" off).
            try:
                r = http.get(f"/v1/jobs/{self.job}")
            except httpx.HTTPError as exc:
                return self._went_offline(f"{type(exc).__name__}: {exc}")
            if r.status_code == 200 and self._register_if_missing:
                self._need_register = False
                return self._came_online()
            if r.status_code == 200:
                try:
                    body["mode"] = r.json()["mode"]
                except (ValueError, KeyError, TypeError):
                    return self._went_offline("garbage answer to GET /v1/jobs/{name}")
            elif r.status_code != 404:
                return self._went_offline(f"HTTP {r.status_code} to GET /v1/jobs/{{name}}")
        if body.get("mode") is None:
            body.pop("mode", None)
        outcome, _ = self._post(http, "/v1/jobs", body, expect_pending=False)
        if outcome == OK:
            with self._lock:  # declared again meanwhile (another OOM): send the newer declaration too
                self._need_register = self._registration_gen != gen
            self._registered_at_s = time.monotonic()
            return OK
        return RETRY  # a refused declaration (422, 403) stays refused until someone fixes it; keep trying slowly

    def _post(self, http: httpx.Client, path: str, item: dict, expect_pending: bool) -> tuple[str, Any]:
        try:
            r = http.post(path, json=item)
        except httpx.HTTPError as exc:
            return self._went_offline(f"{type(exc).__name__}: {exc}"), None
        if 200 <= r.status_code < 300:
            try:
                body = r.json()
                if expect_pending and not isinstance(body.get("pending_changes"), list):
                    raise ValueError("no pending_changes list")
            except (ValueError, AttributeError) as exc:
                return self._went_offline(f"garbage answer ({exc})"), None
            return self._came_online(), body
        if r.status_code == 404:
            self._came_online()
            return UNKNOWN_JOB, None
        if r.status_code >= 500 or r.status_code in RETRY_STATUSES:
            return self._went_offline(f"HTTP {r.status_code}: {r.text[:200]}"), None
        self._came_online()
        self._say(f"refused{r.status_code}{path}", logging.WARNING,
                  "trimtab: server refused %s with HTTP %s (%s); dropped (said once per status)",
                  path, r.status_code, r.text[:300])
        return DROP, None

    def _went_offline(self, why: str) -> str:
        if not self.offline:
            self.offline = True
            log.warning("trimtab: server %s offline (%s); training continues, up to %d reports wait "
                        "(oldest dropped first)", self.server, why, self._queue_max)
        return RETRY

    def _came_online(self) -> str:
        if self.offline:
            self.offline = False
            log.warning("trimtab: server %s back online (%d reports dropped so far)", self.server, self.dropped)
        return OK

    def _say(self, key: str, level: int, msg: str, *args: Any, **kw: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.log(level, msg, *args, **kw)
