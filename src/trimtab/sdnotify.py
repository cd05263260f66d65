"""systemd's notify protocol (sd_notify) without libsystemd: one datagram per message to ``$NOTIFY_SOCKET``.

With ``Type=notify`` systemd waits for READY=1; with ``WatchdogSec=`` it restarts the service when WATCHDOG=1
stops arriving, which is why the pings come from the main loop itself (a hung loop stops pinging). Outside
systemd (no ``$NOTIFY_SOCKET``) every call is a no-op.

No WATCHDOG=1 ever follows STOPPING=1, by construction: a ping checks "stopping?" and sends under one lock, and
STOPPING is sent only by whoever holds that lock. ``stopping()`` is called from a signal handler, which runs on
the main thread — possibly in the middle of a ping that holds the lock — so it never waits for the lock: it
records the request, and the ping in progress sends STOPPING itself on its way out.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Optional


class Notifier:
    def __init__(self, address: Optional[str] = None):
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._sock: Optional[socket.socket] = None
        self._last_watchdog = 0.0
        self._lock = threading.Lock()  # held while a ping or STOPPING is decided and sent
        self._stop_requested = False
        self._stopping_sent = False
        usec = os.environ.get("WATCHDOG_USEC")
        # Ping at half the watchdog period, as sd_watchdog_enabled(3) recommends.
        self.watchdog_interval_s: Optional[float] = int(usec) / 2e6 if usec and usec.isdigit() else None
        if self.address:
            target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
            self._target = target
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, message: str, wait_s: float = 0.0) -> bool:
        """One datagram. A ping or status line never waits (a full notify queue must not stall the sampling loop
        that holds the lock; the next ping replaces a lost one); READY and STOPPING wait up to ``wait_s`` for
        room, since systemd must not miss them."""
        if self._sock is None:
            return False
        try:
            self._sock.settimeout(wait_s if wait_s > 0 else 0.0)
            self._sock.sendto(message.encode(), self._target)
            return True
        except OSError:
            return False  # systemd gone or socket full: never take the daemon down for a notification

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1" + (f"\nSTATUS={status}" if status else ""), wait_s=1.0)

    def status(self, text: str) -> bool:
        """A STATUS line; none once stopping began, so STOPPING=1 is the last word."""
        return self._send_unless_stopping(f"STATUS={text}")

    def stopping(self) -> bool:
        """Say once that shutdown has begun (a signal handler and the final cleanup may both call this). From then
        on no watchdog ping is sent. True when this call sent STOPPING=1 (or left it to the ping in progress)."""
        if self._stop_requested:
            return False
        self._stop_requested = True
        sent = self._flush_stopping()
        return self.enabled if sent is None else sent

    def _flush_stopping(self) -> Optional[bool]:
        """Send a requested STOPPING=1 if the lock is free (its send's result); None when a ping holds the lock:
        that ping sends it on release."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._stop_requested and not self._stopping_sent:
                self._stopping_sent = True
                return self.send("STOPPING=1", wait_s=1.0)
            return False
        finally:
            self._lock.release()

    def watchdog(self, force: bool = False) -> bool:
        """Ping if half the watchdog period has passed (cheap to call every tick); never once stopping began."""
        now = time.monotonic()
        interval = self.watchdog_interval_s if self.watchdog_interval_s is not None else 1.0
        if not force and now - self._last_watchdog < interval:
            return False
        self._last_watchdog = now
        return self._send_unless_stopping("WATCHDOG=1")

    def _send_unless_stopping(self, message: str) -> bool:
        with self._lock:
            sent = False if self._stop_requested else self.send(message)
        if self._stop_requested and not self._stopping_sent:
            self._flush_stopping()  # a stop requested while this send held the lock: say it now
        return sent

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
