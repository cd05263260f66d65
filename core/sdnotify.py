"""systemd's notify protocol (sd_notify) without libsystemd: one datagram per message to ``$NOTIFY_SOCKET``.

With ``Type=notify`` systemd waits for READY=1; with ``WatchdogSec=`` it restarts the service when WATCHDOG=1
stops arriving, which is why the pings come from the main loop itself (a hung loop stops pinging). Outside
systemd (no ``$NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Optional


class Notifier:
    def __init__(self, address: Optional[str] = None):
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._sock: Optional[socket.socket] = None
        self._last_watchdog = 0.0
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

    def send(self, message: str) -> bool:
        if self._sock is None:
            return False
        try:
            self._sock.sendto(message.encode(), self._target)
            return True
        except OSError:
            return False  # systemd gone or socket full: never take the daemon down for a notification

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self) -> bool:
        """Say once that shutdown has begun (a signal handler and the final cleanup may both call this)."""
        if self._stopping_sent:
            return False
        self._stopping_sent = True
        return self.send("STOPPING=1")

    def watchdog(self, force: bool = False) -> bool:
        """Ping if half the watchdog period has passed (cheap to call every tick)."""
        now = time.monotonic()
        interval = self.watchdog_interval_s if self.watchdog_interval_s is not None else 1.0
        if not force and now - self._last_watchdog < interval:
            return False
        self._last_watchdog = now
        return self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
