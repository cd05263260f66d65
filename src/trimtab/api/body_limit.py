"""Refuses request bodies over the limit with 413, before they are buffered: by the declared Content-Length, and
by counting the bytes actually received, so a chunked body (no Content-Length) cannot slip past.

Pure ASGI rather than a Starlette ``BaseHTTPMiddleware``, which would buffer the body it is meant to bound.
"""

from __future__ import annotations

import json
from typing import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The rest of an oversized body is never read, so the connection cannot be reused: say so.
_CLOSE = {"Connection": "close"}


class BodyTooLarge(HTTPException):
    def __init__(self, limit_bytes: int):
        super().__init__(413, f"request body larger than {limit_bytes} bytes", headers=_CLOSE)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit_bytes: Callable[[], int]):
        self.app = app
        self.limit_bytes = limit_bytes  # read per request, so the context's setting is the one in force

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_bytes()
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _reply(send, 413 if declared.isdigit() else 400,
                         f"request body larger than {limit} bytes" if declared.isdigit() else "invalid Content-Length")
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the route's body read: FastAPI re-raises HTTPExceptions, so the app's own
                    # exception middleware answers 413.
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await _reply(send, 413, str(exc.detail))


async def _reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
