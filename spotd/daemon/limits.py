"""Limits of the HTTP API: the largest request body it reads, the time it waits for
one, and what it takes in an ``Idempotency-Key`` and a listing cursor.

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

The same middleware bounds the time a body takes: all of it must have come
within ``[daemon] body_timeout_seconds`` of the request's head, else the
answer is 408 and the connection is closed. uvicorn itself waits for a body
as long as the client keeps the connection open, so a client that sends less
than its ``Content-Length`` would hold a connection and a worker until it
gave up.
"""

from __future__ import annotations

import asyncio
import re

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spotd.daemon.problems import PROBLEM_MEDIA_TYPE, http_problem

DEFAULT_MAX_BODY_BYTES = 1_048_576
"""``[daemon] max_body_bytes`` by default: 1 MiB, some hundred times a large job spec."""
DEFAULT_BODY_TIMEOUT_SECONDS = 10.0
"""``[daemon] body_timeout_seconds`` by default: a 1 MiB body at 100 KB/s, where a
spotd client sends its few KB at once."""
DRAIN_BYTES = 256 * 1_048_576
"""The most of a refused body read (and dropped) so its client sees the 413."""
DRAIN_SECONDS = 10.0
"""The longest a refused body is read for."""
MAX_IDEMPOTENCY_KEY = 200
"""The longest ``Idempotency-Key`` kept (a UUID is 36 characters)."""
MAX_CURSOR = 200
"""The longest listing cursor read: the ones the daemon hands out are under 80."""
QUOTED_START = 24
"""How much of a refused value an error message quotes."""

_KEY = re.compile(r"[!-~]+")
"""Printable ASCII without space: a key goes back and forth in a header, where
the ends of a value are trimmed and control characters are not allowed."""
_CURSOR = re.compile(r"[A-Za-z0-9_-]+")
"""The alphabet of the cursors the daemon makes (URL-safe base64, unpadded)."""


def quoted_start(value: str, keep: int = QUOTED_START) -> str:
    """``value``'s first ``keep`` characters, quoted with every non-ASCII one escaped,
    and how long it was when that is not all: a message never echoes a large value."""
    if len(value) <= keep:
        return ascii(value)
    return f"{value[:keep]!a}... ({len(value):,} characters)"


def idempotency_key_problem(key: str) -> str | None:
    """What is wrong with ``key`` as an ``Idempotency-Key`` (None: nothing).

    A key is 1 to :data:`MAX_IDEMPOTENCY_KEY` characters from ``!`` to ``~``.
    """
    if not key:
        problem = "is empty"
    elif len(key) > MAX_IDEMPOTENCY_KEY:
        problem = "is too long"
    elif _KEY.fullmatch(key) is None:
        at = next(i for i, c in enumerate(key) if _KEY.fullmatch(c) is None)
        problem = f"has a character other than printable ASCII at position {at} ({key[at]!a})"
    else:
        return None
    return (
        f"Idempotency-Key: {quoted_start(key)} {problem}; a key is 1 to "
        f"{MAX_IDEMPOTENCY_KEY} characters, each a printable ASCII one from ! to ~ "
        "(no space), as a UUID is"
    )


def cursor_problem(cursor: str) -> str | None:
    """What makes ``cursor`` no listing cursor by its look (None: it may be one);
    whether it names a place in the listing is the store's to say."""
    if not cursor:
        return "empty"
    if len(cursor) > MAX_CURSOR:
        return f"over the {MAX_CURSOR} characters of any cursor"
    if _CURSOR.fullmatch(cursor) is None:
        return "a character no cursor has"
    return None


def too_large_detail(max_bytes: int, declared: int | None = None) -> str:
    """What a 413 says: how large the body was (if it said), the limit and its setting."""
    size = f"of {declared:,} bytes " if declared is not None else ""
    return (
        f"request body {size}is over this daemon's limit of {max_bytes:,} bytes "
        "([daemon] max_body_bytes); a job's files go in its workdir, not in its spec"
    )


def too_slow_detail(seconds: float) -> str:
    """What a 408 says: the time a body had and its setting."""
    return (
        f"request body not received within {seconds:g} s ([daemon] body_timeout_seconds); "
        "send all of it, as long as its Content-Length says"
    )


class BodyRefused(HTTPException):
    """A body this daemon will not read further, found while it streamed in.

    An :class:`HTTPException`, so that FastAPI, which turns any other error
    while reading a body into a 400, passes it on, and its handler answers
    with this status. ``Connection: close``: the unread rest of the body
    cannot be skipped to reach a next request.
    """

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(status_code=status_code, detail=detail,
                         headers={"Connection": "close"})  # fmt: skip


class BodyTooLarge(BodyRefused):
    """A streamed body passed the size limit: 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, too_large_detail(max_bytes))


class BodyTooSlow(BodyRefused):
    """A body did not all come within its time: 408."""

    def __init__(self, seconds: float) -> None:
        super().__init__(408, too_slow_detail(seconds))


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 without being read,
    one not all there within ``timeout_seconds`` of the request's head gets 408."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = DEFAULT_MAX_BODY_BYTES,
        timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_seconds = timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a declared length over the limit; count and time a body as it comes."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            if declared <= DRAIN_BYTES:
                await _discard_rest(receive)
            await _answer(send, 413, too_large_detail(self.max_bytes, declared))
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_seconds
        seen = 0
        whole = False
        started = False

        async def counted() -> Message:
            nonlocal seen, whole
            if whole:
                # Past the body only a disconnect is waited for, as long as a
                # streamed answer lasts: no deadline for that.
                return await receive()
            message = await self._before(deadline, receive)
            whole = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if not whole:
                        await _discard_rest(receive)
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyRefused as exc:
            # Raised past every handler (an app without FastAPI's): answer here,
            # unless a response is already on its way.
            if started:
                raise
            await _answer(send, exc.status_code, str(exc.detail))

    async def _before(self, deadline: float, receive: Receive) -> Message:
        """The next message of the body, if it comes by ``deadline``; else 408."""
        try:
            async with asyncio.timeout_at(deadline):
                return await receive()
        except TimeoutError:
            raise BodyTooSlow(self.timeout_seconds) from None


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


async def _answer(send: Send, status: int, detail: str) -> None:
    body = http_problem(status, detail).body()
    await send({
        "type": "http.response.start",
        "status": status,
        # The unread rest of the body cannot be skipped to reach a next request.
        "headers": [
            (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})
