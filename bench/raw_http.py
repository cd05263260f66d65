"""A keep-alive HTTP/1.1 client on bare asyncio streams, for benches that time one server's requests from one process.

Why not httpx: in report_latency.py one process posts 100 jobs' reports, and httpx costs ~1-2 ms of CPU per request.
On a machine whose cores are busy that process's own queue became the figure: with two CPU burners the server had
a report in hand for 23-44 ms (p50, timed inside the server), the bench saw 750-1 100 ms (2026-12-06). This client
sends a request already encoded and reads the status line, the headers and a Content-Length body (all trimtab
answers): ~0.1 ms a request. One connection per job, as one hook holds one; a connection the server closed while
idle (uvicorn's keep-alive timeout) is opened again once, as any HTTP client does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class RawHttp:
    """One connection to ``host:port`` sending JSON POSTs with a bearer token; not for concurrent use."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self._host, self._port = host, port
        self._head = (f"host: {host}:{port}\r\nauthorization: Bearer {token}\r\n"
                      "content-type: application/json\r\n").encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        """(status, the JSON body) of ``POST path``; a connection closed while idle is reopened once."""
        data = json.dumps(body).encode()
        request = b"POST %s HTTP/1.1\r\n%scontent-length: %d\r\n\r\n%s" % (path.encode(), self._head, len(data), data)
        for attempt in (0, 1):
            fresh = self._writer is None
            if fresh:
                self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
            try:
                self._writer.write(request)
                return await self._response()
            except (asyncio.IncompleteReadError, ConnectionError):
                await self.close()
                if fresh or attempt:  # a new connection that fails is the server's failure, not an idle close
                    raise
        raise AssertionError("unreachable")

    async def _response(self) -> tuple[int, Any]:
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:] if line)}
        if b"content-length" not in headers:
            raise ValueError(f"HTTP {status} without Content-Length: {head[:200]!r}")
        payload = await self._reader.readexactly(int(headers[b"content-length"]))
        if headers.get(b"connection", b"").lower() == b"close":
            await self.close()
        return status, json.loads(payload) if payload else None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass
        self._reader = self._writer = None
