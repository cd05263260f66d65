"""The hook's link to the server (``Reporter``), its only network path: a background thread that registers the job,
posts step reports and acks, and hands the server's pending knob changes to the hook.

Fail-open by construction: the training thread only appends to a bounded in-memory queue (``submit`` never
waits, never raises on a network problem); the thread retries with exponential backoff, drops the oldest
reports once the queue is full (counted), says once that the server is offline and once that it is back, and
re-registers when the server answers 404 (it forgot the job: a fresh store, a restart from scratch).

No report is lost to a head outage of hours: what cannot go waits in memory (the newest ``queue_max``) and, past
half of that, on disk (:mod:`trimtab.trainer.backlog`, :mod:`trimtab.trainer.report_spool`; bounded by
``spool_max_bytes``, said in the "offline" line), and goes when a server answers again, oldest first. A resend is
idempotent: the server stores a (job, step, rank) once and its answer says how many of a batch were new, so the
counts (:mod:`trimtab.trainer.report_counts`) are exact. Several servers (a list, or URLs separated by commas): a
connection failure, a timeout or a 5xx moves to the next at once; only when every one has failed in a row does the
reporter back off. A knob change two servers relay (they share one store) is one change id: the hook applies it
once (:mod:`trimtab.trainer.knob_agreement`).

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
from typing import Any, Callable, Optional, Sequence, Union

import httpx

from trimtab.contract.knobs import ChangeAck, ChangeRefusal
from trimtab.contract.step_report import MAX_REPORTS_PER_BATCH
from trimtab.trainer.backlog import SPOOL_MAX_BYTES, Backlog
from trimtab.trainer.job_token import AUTH_REFUSED, refusal_line
from trimtab.trainer.servers import Servers

log = logging.getLogger("trimtab.trainer")

OK, RETRY, DROP, UNKNOWN_JOB, NO_ROUTE, FAILOVER = "ok", "retry", "drop", "unknown_job", "no_route", "failover"
RETRY_STATUSES = {408, 425, 429}  # transient: retried as an outage
# What FastAPI (Starlette) itself answers for a path or method no route serves: an older server without the batch
# route. The API's own 404 for a job it does not know says "no job named …" (api/routes/jobs.py: find_job).
NO_SUCH_ROUTE = {"not found", "method not allowed"}


class Reporter:
    """Posts reports for ``job`` to ``server`` from its own thread.

    ``server``: a URL, several separated by commas, or a list of them (fail-over in that order, see the module).
    ``registration``: the ``POST /v1/jobs`` body this reporter declares (rank 0 of a job), or None (other ranks
    only post; rank 0 registers). ``register_if_missing``: declare only if the server does not know the job yet
    (a log tailer must not overwrite the knobs a hook inside the job declared). ``on_pending`` receives each
    successful report response's ``pending_changes`` list (rank 0 only). ``batch_max``: the most queued reports
    sent in one POST (1 to MAX_REPORTS_PER_BATCH; 1: one POST per report, never a batch). ``min_interval_s``: the
    least time from one POST's start to the next one's (0: none) — a job whose steps are longer posts each report
    as it comes; a faster one's reports queue meanwhile and go together. ``queue_max``: reports kept in memory;
    ``spool_dir`` / ``spool_max_bytes``: where and how much waits on disk beyond that (0: no spool) and
    ``spool_name`` its directory's name (default: the job's).
    """

    def __init__(self, server: Union[str, Sequence[str]], job: str, token: Optional[str] = None, *,
                 registration: Optional[dict] = None, register_if_missing: bool = False,
                 on_pending: Optional[Callable[[list], None]] = None, queue_max: int = 256,
                 timeout_s: float = 1.0, backoff_max_s: float = 5.0,
                 transport: Optional[httpx.BaseTransport] = None, batch_max: int = 64,
                 min_interval_s: float = 0.25, spool_dir: Optional[str] = None,
                 spool_max_bytes: int = SPOOL_MAX_BYTES, spool_name: Optional[str] = None):
        if not 1 <= batch_max <= MAX_REPORTS_PER_BATCH:
            raise ValueError(f"batch_max must be 1 to {MAX_REPORTS_PER_BATCH} reports, not {batch_max!r}")
        self._servers, self.job = Servers(server), job
        self.servers = self._servers.urls
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.auth_refused: Optional[int] = None  # the status of the server's refusal of the token, until taken
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
        self.backlog = Backlog(queue_max, spool_name or job, spool_dir, spool_max_bytes)
        self._acks: deque = deque()
        self._batch_max = batch_max  # 1 once the server turned out to have no batch route
        self._min_interval_s = max(0.0, float(min_interval_s))
        self._reports_went = False  # the last send was reports (the next POST waits for min_interval_s)
        self._singly = 0  # reports at the queue's front to send one by one (a batch the server refused whole)
        self._in_doubt = False  # the last failed POST may have reached the server (no answer, or a 5xx)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flush_deadline = float("inf")
        self._said: set[str] = set()  # one-time log lines already written
        self._said_this_outage: set[str] = set()
        self._thread = threading.Thread(target=self._run, name=f"trimtab-reporter-{job}", daemon=True)
        self._thread.start()

    @property
    def server(self) -> str:
        """The server in use now."""
        return self._servers.current

    # -- the training thread's side: cheap, never blocks on the network or a disk -----------------------------

    def submit(self, report: dict) -> None:
        queued = self.backlog.put(report)
        if queued in (1, self._batch_max):
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
        """Sends what is queued for at most ``timeout_s`` (giving up at the first failure), then stops; what is
        still unsent waits on disk for the job's next run (counted ``left``), or, where the spool cannot keep it, is
        counted dropped ("closed") and said."""
        self._flush_deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s + 1.5)
        lost = self.backlog.close()
        if lost:
            log.warning("trimtab: closed with %d reports of job %s not sent (no server answered in time); they "
                        "are lost (counted: dropped_by closed)", lost, self.job)

    @property
    def queued(self) -> int:
        return self.backlog.pending + len(self._acks)

    @property
    def sent(self) -> int:
        return self.backlog.counts.sent

    @property
    def dropped(self) -> int:
        return self.backlog.counts.dropped

    @property
    def rejected(self) -> int:
        return self.backlog.counts.rejected

    def stats(self) -> dict:
        """The report counts (:class:`~trimtab.trainer.report_counts.ReportCounts`), the server in use, whether every
        server is away and whether the server refuses the token (``auth_refused``: it answers; not an outage)."""
        return {**self.backlog.stats(), "server": self.server, "offline": self.offline,
                "auth_refused": self.auth_refused is not None}

    # -- the reporter thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff_s = 0.0
        clients = [httpx.Client(base_url=url, headers=self._headers, timeout=self._timeout,
                                transport=self._transport) for url in self.servers]
        try:
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
                    http = clients[self._servers.index]
                    outcome = self._register(http) if self._need_register else self._send_next(http)
                except Exception:  # a bug here must not end the thread: the job would go silent for good
                    self._say("bug", logging.ERROR, "trimtab: reporter error (retrying)", exc_info=True)
                    outcome = RETRY
                if outcome is None:  # nothing queued
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                if outcome == FAILOVER:
                    continue  # the next server at once
                backoff_s = min(self._backoff_max_s, max(0.1, backoff_s * 2)) if outcome == RETRY else 0.0
                if outcome == OK and self._reports_went:
                    self._pace(began_s + self._min_interval_s)
        finally:
            for client in clients:
                client.close()

    def _pace(self, until_s: float) -> None:
        """After a POST of reports, wait until ``until_s``: what a job of short steps reports meanwhile queues and
        goes in the next POST. A registration, an ack, a full batch in memory when memory goes next (a job
        reporting faster than ``batch_max`` an interval must not fill the queue) or close() ends the wait. A backlog
        on disk goes paced too (``batch_max`` an interval, 256 reports/s by default: a 10-minute outage at 20 steps/s
        is sent in about 50 s): after an outage every rank of every job sends its backlog at once."""
        while not self._stop.is_set() and not self._acks and not self._need_register \
                and (self.backlog.on_disk or self.backlog.memory_len < self._batch_max):
            left_s = until_s - time.monotonic()
            if left_s <= 0:
                return
            self._wake.wait(left_s)
            self._wake.clear()

    def _has_work(self) -> bool:
        return bool(self.backlog.pending or self._acks or self._need_register)

    def _send_next(self, http: httpx.Client) -> Optional[str]:
        """Sends what comes next: an ack or refusal (first, one at a time), else the oldest queued reports —
        several in one POST when more than one is queued, else the one."""
        with self._lock:
            ack = self._acks.popleft() if self._acks else None
        if ack is not None:
            return self._send_ack(http, *ack)
        reports = self.backlog.take(1 if self._singly or self._batch_max == 1 else self._batch_max)
        self._reports_went = bool(reports)
        if not reports:
            return None
        if len(reports) > 1:
            return self._send_batch(http, reports)
        self._singly = max(0, self._singly - 1)
        return self._send_report(http, reports[0])

    def _send_ack(self, http: httpx.Client, kind: str, item: dict) -> str:
        outcome, _ = self._post(http, f"/v1/jobs/{self.job}/{kind}", item, expect_pending=False)
        if outcome == UNKNOWN_JOB:
            self._say("ack404", logging.WARNING, "trimtab: the server does not know change %s of job %s; "
                      "the %s is dropped", item["change_id"], self.job, kind[:-1])
        elif outcome in (RETRY, FAILOVER):
            with self._lock:
                self._acks.appendleft((kind, item))
        return outcome

    def _send_report(self, http: httpx.Client, report: dict) -> str:
        outcome, body = self._post(http, f"/v1/jobs/{self.job}/reports", report, expect_pending=True)
        if outcome == OK:
            self.backlog.confirmed(stored=1 if body.get("stored", True) else 0)
            self._hand_pending(body)
        elif outcome == UNKNOWN_JOB:
            self.backlog.failed(retried=False)
            return self._job_unknown()
        elif outcome == DROP:
            self.backlog.refused()
        else:
            self.backlog.failed(retried=True, in_doubt=self._in_doubt)
        return outcome

    def _send_batch(self, http: httpx.Client, batch: list[dict]) -> str:
        """Several queued reports in one POST: the same outcomes as one report's, for all of them at once, and two
        of its own — a batch refused whole (one bad report in it: they go again one by one, so only that one is
        refused) and a server without the batch route (one POST per report from then on)."""
        outcome, body = self._post(http, f"/v1/jobs/{self.job}/report-batches", {"reports": batch},
                                   expect_pending=True, batch=True)
        if outcome == OK:
            stored = body.get("stored")
            self.backlog.confirmed(stored=stored if isinstance(stored, int) else len(batch))
            self._hand_pending(body)
            return OK
        if outcome in (RETRY, FAILOVER):
            self.backlog.failed(retried=True, in_doubt=self._in_doubt)
            return outcome
        self.backlog.failed(retried=False)  # the server answered and stored none of them: all or nothing
        if outcome == UNKNOWN_JOB:
            return self._job_unknown()
        if outcome == DROP:
            self._singly = len(batch)
            return OK  # no backoff: the server answered, and the reports go again at once, one per POST
        self._batch_max = 1  # NO_ROUTE
        self._say("no-batches", logging.WARNING, "trimtab: server %s has no batch route (an older trimtab); "
                  "one POST per report from now on", self.server)
        return OK

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
        (no such route, not the API's "no job named …") is NO_ROUTE, and a refusal (DROP) is not said as a loss.
        A failure sets ``_in_doubt``: whether the server may have done it (anything but a connection never made)."""
        try:
            r = http.post(path, json=item)
        except httpx.HTTPError as exc:
            self._in_doubt = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
            return self._went_offline(f"{type(exc).__name__}: {exc}"), None
        self._in_doubt = True
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
        if r.status_code in AUTH_REFUSED:
            self._in_doubt = False
            return self._token_refused(r, path), None
        if r.status_code == 404:
            self._came_online()
            return UNKNOWN_JOB, None
        if r.status_code >= 500 or r.status_code in RETRY_STATUSES:
            self._in_doubt = r.status_code >= 500
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
        """The server in use failed: the next one at once (FAILOVER) while some have not failed in a row, else
        RETRY (back off), said once an outage."""
        failed, was_offline = self.server, self._servers.offline
        self.backlog.set_away(True)
        all_failed = self._servers.failed()
        if len(self.servers) > 1:
            self._say_once_an_outage(f"failover {failed}", "trimtab: server %s failed (%s); trying %s",
                                     failed, why, self.server)
        if not all_failed:
            return FAILOVER
        if not was_offline:
            log.warning("trimtab: server%s %s offline (%s); training continues: %s", "s" * (len(self.servers) > 1),
                        ", ".join(self.servers), why, self.backlog.describe())
        return RETRY

    def _token_refused(self, r: httpx.Response, path: str) -> str:
        """The server answered 401/403: the token, not the network. Reports wait as in an outage (spilled to disk
        sooner) and are retried with backoff — an admin may fix the token — but the servers are not marked away
        and no fail-over is tried (they share one store: the same token is refused by all). Said once at ERROR,
        naming the server and what to do, until the token is taken again."""
        self.backlog.set_away(True)
        if self.auth_refused is None:
            self.auth_refused = r.status_code
            log.error(refusal_line(self.server, self.job, path, r))
        return RETRY

    def _came_online(self) -> str:
        if self.auth_refused is not None:
            log.warning("trimtab: server %s accepts job %s's token now; %d reports wait to be sent", self.server,
                        self.job, self.backlog.pending)
            self.auth_refused = None
        self.backlog.set_away(False)
        was_offline = self._servers.offline
        away_s = self._servers.answered()
        if was_offline:
            b = self.backlog
            log.warning("trimtab: server %s back online after %.0f s; %d reports wait to be sent (%d bytes on "
                        "disk), %d dropped and %d unconfirmed so far", self.server, away_s, b.pending,
                        b.spool_bytes, b.counts.dropped, b.counts.unconfirmed)
            self._said_this_outage.clear()
        return OK

    @property
    def offline(self) -> bool:
        """Every server failed in a row (the last attempts); False again at the first answer."""
        return self._servers.offline

    def _say_once_an_outage(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._said_this_outage:
            self._said_this_outage.add(key)
            log.warning(msg, *args)

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
