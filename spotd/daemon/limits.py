"""Limits of the HTTP API: the largest request body it reads.

An ASGI middleware rather than a route dependency: it sees a request before
FastAPI reads its body, so an oversized body is refused before it is in
memory. A declared ``Content-Length`` over the limit is answered at once,
unread; a body without one (chunked) is counted as it streams in and refused
at the first chunk that passes the limit.

Either way the rest of the body is then read and thrown away, up to
``DRAIN_BYTES`` and ``DRAIN_SECONDS``, before the answer goes out: a server
that closes a connection with unread data in it makes the kernel reset it,
and the reset can destroy the 413 before the client reads it (seen with a
50 MB submit). Thrown away chunk by chunk, the body never sits in memory.
"""

from __future__ import annotations

import asyncio
import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 1_048_576
"""``[daemon] max_body_bytes`` by default: 1 MiB, some hundred times a large job spec."""
DRAIN_BYTES = 256 * 1_048_576
"""The most of a refused body read (and dropped) so its client sees the 413."""
DRAIN_SECONDS = 10.0
"""The longest a refused body is read for."""


def too_large_detail(max_bytes: int, declared: int | None = None) -> str:
    """What a 413 says: how large the body was (if it said), the limit and its setting."""
    size = f"of {declared:,} bytes " if declared is not None else ""
    return (
        f"request body {size}is over this daemon's limit of {max_bytes:,} bytes "
        "([daemon] max_body_bytes); a job's files go in its workdir, not in its spec"
    )


class BodyTooLarge(HTTPException):
    """A streamed body passed the limit.

    An :class:`HTTPException`, so that FastAPI, which turns any other error
    while reading a body into a 400, passes it on, and its handler answers 413.
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            status_code=413, detail=too_large_detail(max_bytes), headers={"Connection": "close"}
        )


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 without being read."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a declared length over the limit; count a streamed body as it comes."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            if declared <= DRAIN_BYTES:
                await _discard_rest(receive)
            await _answer_413(send, too_large_detail(self.max_bytes, declared))
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if message.get("more_body", False):
                        await _discard_rest(receive)
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge as exc:
            # Raised past every handler (an app without FastAPI's): answer here,
            # unless a response is already on its way.
            if started:
                raise
            await _answer_413(send, str(exc.detail))


async def _discard_rest(receive: Receive) -> None:
    """Read what is left of a request body and drop it, within the drain bounds."""
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            read = 0
            while read <= DRAIN_BYTES:
                message = await receive()
                read += len(message.get("body", b""))
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
    except TimeoutError:
        return  # a slow sender: answer anyway, and let the close cut it off


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length itself
    return None


async def _answer_413(send: Send, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({
        "type": "http.response.start",
        "status": 413,
        # The unread rest of the body cannot be skipped to reach a next request.
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})
