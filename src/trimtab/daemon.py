"""Process wiring for `trimtab up` (agent + API on one node) and `trimtab server` (API for many agents).

The API runs on uvicorn in a thread; the main thread runs the loop that matters (the agent's sampler, or the
server's upkeep) and pings the systemd watchdog from inside that loop, so a hung loop gets the service
restarted. READY is sent once the API listens; STOPPING when a signal arrives; the agent's writer then
flushes (queued batches written or spooled) before the process exits.
"""

from __future__ import annotations

import gc
import ipaddress
import logging
import socket
import threading
import time
from typing import Callable

from trimtab.sdnotify import Notifier

log = logging.getLogger("trimtab.daemon")


class DaemonError(RuntimeError):
    """The daemon cannot start; the message says why and what to do."""


def settle_heap() -> int:
    """Collect once and move every object that survived start-up (modules, the app, the routes, the store's
    metadata) out of the collector's sight; returns how many were moved.

    A full collection walks every tracked object. In the API's process that was ~110 000 objects after start-up,
    and each full collection while serving stopped every request for 60-90 ms (seen in the report-latency bench,
    issue 20); with start-up's objects frozen, the same collections walk the ~10 000 made since and take ~6 ms.
    The frozen objects live as long as the process anyway."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    if not host:  # "" binds every interface
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


class ApiServer:
    """uvicorn serving ``app`` from a background thread; ``start`` returns once it listens (or raises)."""

    def __init__(self, app, host: str, port: int, log_level: str = "warning"):
        import uvicorn

        self.host, self.port = host, port
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                lifespan="off", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="trimtab-api", daemon=True)
        self.ledger = None  # the GPU-time ledger's ticker beside the API (cli/serve_cmd.py starts it), stopped with it

    def start(self, timeout_s: float = 15.0) -> "ApiServer":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise DaemonError(f"the API could not listen on {self.host}:{self.port} (in use? see the log above)")
            if time.monotonic() > deadline:
                raise DaemonError(f"the API did not start listening on {self.host}:{self.port} within {timeout_s:g} s")
            time.sleep(0.02)
        if self.port == 0:  # an ephemeral port: report the one the OS chose
            self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


class StatusPinger:
    """Calls from the main loop: watchdog every tick, a STATUS line and a log line every ``every_s``."""

    def __init__(self, notifier: Notifier, line: Callable[[], str], every_s: float = 10.0, log_it: bool = True):
        self.notifier, self.line, self.every_s, self.log_it = notifier, line, every_s, log_it
        self._next = time.monotonic() + every_s

    def __call__(self) -> None:
        self.notifier.watchdog()
        if time.monotonic() >= self._next:
            self._next = time.monotonic() + self.every_s
            text = self.line()
            self.notifier.status(text)
            if self.log_it:
                log.info("%s", text)


def wait_loop(stop: threading.Event, tick: Callable[[], None], period_s: float = 1.0,
              alive: Callable[[], bool] = lambda: True) -> None:
    """The server's main loop: tick until stopped (or until ``alive`` says the API thread died)."""
    while not stop.wait(period_s):
        if not alive():
            log.error("the API thread stopped unexpectedly; exiting so systemd can restart the service")
            return
        tick()

