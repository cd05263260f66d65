"""The hook's link to the server (``Reporter``), its only network path: a background thread that registers the job,
posts step reports and acks, and hands the server's pending knob changes to the hook.

Fail-open by construction: the training thread only appends to a bounded in-memory queue (``submit`` never
waits, never raises on a network problem); the thread retries with exponential backoff, drops the oldest
reports once the queue is full (counted), says once that the server is offline and once that it is back, and
re-registers when the server answers 404 (it forgot the job: a fresh store, a restart from scratch).

One report queued is one POST; several queued (steps shorter than a POST takes, or than ``min_interval_s``, 250 ms,
between POSTs — a full batch of ``batch_max`` goes at once; a backlog after an outage) go in one POST of up to
``batch_max`` to the batch route. The reporter thread's CPU is mostly its HTTP requests (1.8–2.6 ms of CPU a POST, a
little more for more reports; 4.4–4.6 ms per report beside the reference pipeline, BENCHMARKS.md): a job of 5–12 ms
steps cannot pay that per step without a whole core and its training thread waiting for the GIL, and a reporter that
falls behind drops reports (one POST each dropped 15–62 % of the reports of 2–10 ms steps; batched and paced, none:
bench/report_batching.py). Paced, the reporter costs a job of short steps about one POST per interval: 3.5 % of a
core at 50 ms, under 1 % at 250 ms. The server refuses a batch whole (422) when one report in it is invalid; its
reports then go one by one, so only that one is lost. A server older than the batch route gets one POST per report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

import httpx

from trimtab.contract.knobs import ChangeAck, ChangeRefusal
from trimtab.contract.step_report import MAX_REPORTS_PER_BATCH

log = logging.getLogger("trimtab.trainer")

OK, RETRY, DROP, UNKNOWN_JOB, NO_ROUTE = "ok", "retry", "drop", "unknown_job", "no_route"
RETRY_STATUSES = {401, 403, 408, 425, 429}  # auth may be fixed by an admin; the others are transient
# What FastAPI (Starlette) itself answers for a path or method no route serves: an older server without the batch
# route. The API's own 404 for a job it does not know says "no job named …" (api/routes/jobs.py: find_job).
NO_SUCH_ROUTE = {"not found", "method not allowed"}


class Reporter:
    """Posts reports for ``job`` to ``server`` from its own thread.

    ``registration``: the ``POST /v1/jobs`` body this reporter declares (rank 0 of a job), or None (other ranks
    only post; rank 0 registers). ``register_if_missing``: declare only if the server does not know the job yet
    (a log tailer must not overwrite the knobs a hook inside the job declared). ``on_pending`` receives each
    successful report response's ``pending_changes`` list (rank 0 only). ``batch_max``: the most queued reports
    sent in one POST (1 to MAX_REPORTS_PER_BATCH; 1: one POST per report, never a batch). ``min_interval_s``: the
    least time from one POST's start to the next one's (0: none) — a job whose steps are longer posts each report
    as it comes; a faster one's reports queue meanwhile and go together.
    """

    def __init__(self, server: str, job: str, token: Optional[str] = None, *,
                 registration: Optional[dict] = None, register_if_missing: bool = False,
                 on_pending: Optional[Callable[[list], None]] = None, queue_max: int = 256,
                 timeout_s: float = 1.0, backoff_max_s: float = 5.0,
                 transport: Optional[httpx.BaseTransport] = None, batch_max: int = 64,
                 min_interval_s: float = 0.25):
        if not 1 <= batch_max <= MAX_REPORTS_PER_BATCH:
            raise ValueError(f"batch_max must be 1 to {MAX_REPORTS_PER_BATCH} reports, not {batch_max!r}")
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
        self._batch_max = batch_max  # 1 once the server turned out to have no batch route
        self._min_interval_s = max(0.0, float(min_interval_s))
        self._reports_went = False  # the last send was reports (the next POST waits for min_interval_s)
        self._singly = 0  # reports at the queue's front to send one by one (a batch the server refused whole)
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
            queued = len(self._reports)
        if queued == 1 or queued >= self._batch_max:
            # The reporter idles until a first report comes, and a paced one waits out its interval unless a full
            # batch is in: a wake per step would hand the GIL to the reporter thread at every step of a fast job.
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
                began_s, self._reports_went = time.monotonic(), False
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
                if outcome == OK and self._reports_went:
                    self._pace(began_s + self._min_interval_s)

    def _pace(self, until_s: float) -> None:
        """After a POST of reports, wait until ``until_s``: what a job of short steps reports meanwhile queues and
        goes in the next POST. A registration, an ack, a full batch (a job reporting faster than ``batch_max`` an
        interval must not fill the queue and drop) or close() ends the wait."""
        while not self._stop.is_set() and not self._acks and not self._need_register \
                and len(self._reports) < self._batch_max:
            left_s = until_s - time.monotonic()
            if left_s <= 0:
                return
            self._wake.wait(left_s)
            self._wake.clear()

    def _has_work(self) -> bool:
        return bool(self._reports or self._acks or self._need_register)

    def _send_next(self, http: httpx.Client) -> Optional[str]:
        """Sends what comes next: an ack or refusal (first, one at a time), else the queued reports — several in
        one POST when more than one is queued, else the one."""
        with self._lock:
            batch: list[dict] = []
            self._reports_went = not self._acks and bool(self._reports)
            if self._acks:
                kind, item = self._acks.popleft()
            elif len(self._reports) > 1 and self._batch_max > 1 and not self._singly:
                batch = [self._reports.popleft() for _ in range(min(self._batch_max, len(self._reports)))]
            elif self._reports:
                kind, item = "reports", self._reports.popleft()
                self._singly = max(0, self._singly - 1)
            else:
                return None
        return self._send_batch(http, batch) if batch else self._send_one(http, kind, item)

    def _send_one(self, http: httpx.Client, kind: str, item: dict) -> str:
        outcome, body = self._post(http, f"/v1/jobs/{self.job}/{kind}", item,
                                   expect_pending=(kind == "reports"))
        if outcome == OK:
            self.sent += 1
            if kind == "reports":
                self._hand_pending(body)
        elif outcome == UNKNOWN_JOB and kind != "reports":
            self._say("ack404", logging.WARNING, "trimtab: the server does not know change %s of job %s; "
                      "the %s is dropped", item["change_id"], self.job, kind[:-1])
        elif outcome == UNKNOWN_JOB:
            self._requeue(kind, item)
            return self._job_unknown()
        elif outcome == DROP:
            self.rejected += 1
        else:
            self._requeue(kind, item)
        return outcome

    def _send_batch(self, http: httpx.Client, batch: list[dict]) -> str:
        """Several queued reports in one POST: the same outcomes as one report's, for all of them at once, and two
        of its own — a batch refused whole (one bad report in it: they go again one by one, so only that one is
        refused) and a server without the batch route (one POST per report from then on)."""
        outcome, body = self._post(http, f"/v1/jobs/{self.job}/report-batches", {"reports": batch},
                                   expect_pending=True, batch=True)
        if outcome == OK:
            self.sent += len(batch)
            self._hand_pending(body)
            return OK
        kept = self._requeue_reports(batch)
        if outcome == UNKNOWN_JOB:
            return self._job_unknown()
        if outcome == DROP:
            self._singly = kept
            return OK  # no backoff: the server answered, and the reports go again at once, one per POST
        if outcome == NO_ROUTE:
            self._batch_max = 1
            self._say("no-batches", logging.WARNING, "trimtab: server %s has no batch route (an older trimtab); "
                      "one POST per report from now on", self.server)
            return OK
        return outcome

    def _hand_pending(self, body: dict) -> None:
        if self._on_pending is not None and body["pending_changes"]:
            self._on_pending(body["pending_changes"])

    def _job_unknown(self) -> str:
        """The server answered 404 for the job (reports requeued): register it again, once rank 0 may."""
        if self._registration is None:
            return RETRY  # another rank registers the job; wait for it
        self._need_register = True
        # Re-register at once, unless we just did and the server still says 404: then do not hammer it.
        return RETRY if time.monotonic() - self._registered_at_s < 1.0 else OK

    def _requeue(self, kind: str, item: dict) -> None:
        if kind == "reports":
            self._requeue_reports([item])
            return
        with self._lock:
            self._acks.appendleft((kind, item))

    def _requeue_reports(self, reports: list[dict]) -> int:
        """Puts ``reports`` back at the queue's front, in order, as far as ``queue_max`` allows: the oldest of them
        are dropped (counted) when newer reports filled the queue meanwhile (those are worth more). How many fit."""
        with self._lock:
            room = max(0, self._queue_max - len(self._reports))
            kept = reports[len(reports) - room:] if room < len(reports) else reports
            self.dropped += len(reports) - len(kept)
            self._reports.extendleft(reversed(kept))
            return len(kept)

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

    def _post(self, http: httpx.Client, path: str, item: dict, expect_pending: bool,
              batch: bool = False) -> tuple[str, Any]:
        """POSTs ``item``: (outcome, the answer's JSON when OK). ``batch``: a 404/405 from the framework itself
        (no such route, not the API's "no job named …") is NO_ROUTE, and a refusal (DROP) is not said as a loss."""
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
        if batch and r.status_code in (404, 405) and _no_such_route(r):
            self._came_online()
            return NO_ROUTE, None
        if r.status_code == 404:
            self._came_online()
            return UNKNOWN_JOB, None
        if r.status_code >= 500 or r.status_code in RETRY_STATUSES:
            return self._went_offline(f"HTTP {r.status_code}: {r.text[:200]}"), None
        self._came_online()
        if batch:  # not a loss: its reports go again one by one, and a refused one is said then
            log.debug("trimtab: server refused a batch with HTTP %s (%s)", r.status_code, r.text[:300])
        else:
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


def _no_such_route(r: httpx.Response) -> bool:
    """Whether a 404/405 is the framework's own (no route for this path or method: a server older than the route),
    not the API's (a job it does not know)."""
    try:
        detail = r.json().get("detail")
    except (ValueError, AttributeError):
        return False
    return isinstance(detail, str) and detail.strip().lower() in NO_SUCH_ROUTE
