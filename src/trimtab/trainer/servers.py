"""The servers a job reports to, in fail-over order: one URL, several separated by commas (``$TRIMTAB_SERVER``), or
a list. Several heads over one PostgreSQL serve ingest alike, so the reporter keeps the one that answers and moves
to the next when it fails (a connection refused, a timeout, a 5xx) at once, backing off only when every one has
failed in a row; the one it left is tried again when its turn comes round."""

from __future__ import annotations

import time
from typing import Sequence, Union

from trimtab.contract.servers import server_urls as contract_server_urls


def server_urls(server: Union[str, Sequence[str]]) -> list[str]:
    """The URLs of ``server`` (``trimtab.contract.servers``); at least one, else ValueError."""
    urls = contract_server_urls(server)
    if not urls:
        raise ValueError(f"no server URL in {server!r}")
    return urls


class Servers:
    """Which server is in use (``current``), and whether every one is away (``offline``, since when)."""

    def __init__(self, server: Union[str, Sequence[str]]):
        self.urls = server_urls(server)
        self.index = 0
        self.failures = 0  # failures in a row, over all servers
        self.offline = False
        self.offline_since_s = 0.0

    @property
    def current(self) -> str:
        return self.urls[self.index]

    def failed(self) -> bool:
        """The one in use failed: the next one is in use now. True when every one has failed in a row (back off;
        ``offline`` from now on)."""
        self.failures += 1
        self.index = (self.index + 1) % len(self.urls)
        if self.failures < len(self.urls):
            return False
        if not self.offline:
            self.offline, self.offline_since_s = True, time.monotonic()
        return True

    def answered(self) -> float:
        """The one in use answered; how long every server had been away (0: they were not)."""
        self.failures = 0
        away_s = time.monotonic() - self.offline_since_s if self.offline else 0.0
        self.offline = False
        return away_s
