"""The daemon's HTTP/1.1 server protocol: uvicorn's h11 one, with a status for every
request it cannot read.

uvicorn answers a request that h11 refuses (a head over h11's size limit, a
malformed line) with a plain-text 400 and closes the connection at once. A
client whose head is over the limit is still sending it then; closing a socket
with unread data in it makes the kernel reset the connection, and the client
sees the reset instead of the status (a 1 MB header did). Here the answer is
431 for a head over the limit and 400 for the rest, as the API's problems
(:mod:`spotd.daemon.problems`);
then this side of the connection is shut and what the client still sends is
read and dropped, within :data:`~spotd.daemon.limits.DRAIN_BYTES` and
:data:`~spotd.daemon.limits.DRAIN_SECONDS`, until it closes: so the answer
reaches it.

The daemon names this class as uvicorn's ``http`` (:mod:`spotd.daemon.process`):
the implementation is not left to what happens to be installed, as uvicorn's
``auto`` would take httptools, with other limits and answers, where present.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from spotd.daemon.limits import DRAIN_BYTES, DRAIN_SECONDS
from spotd.daemon.problems import PROBLEM_MEDIA_TYPE, http_problem

MAX_HEAD_BYTES = 16 * 1024
"""The largest request head read (request line, headers and cookies together):
h11's own default, some ten times the head of a spotd client or of a browser on
the dashboard. The daemon passes it to uvicorn as ``h11_max_incomplete_event_size``."""


class _Connection(h11.Connection):
    """h11's connection, keeping the error it refused the peer's request with."""

    refusal: h11.RemoteProtocolError | None = None

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """h11's next event; a refusal is kept before it is raised."""
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refusal = exc
            raise


class DaemonHttp(H11Protocol):
    """uvicorn's h11 protocol, answering an unreadable request with 431 or 400 and
    draining the connection before it closes."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_head = config.h11_max_incomplete_event_size or MAX_HEAD_BYTES
        self._h11 = _Connection(h11.SERVER, self.max_head)
        self.conn = self._h11
        self._closing: asyncio.TimerHandle | None = None
        self._dropped = 0

    def send_400_response(self, msg: str) -> None:
        """Answer a request h11 refused (uvicorn's one call for it), then drain."""
        status, detail = self._refusal(msg)
        body = http_problem(status, detail).body()
        headers = [
            (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        reason = HTTPStatus(status).phrase.encode()
        response = h11.Response(status_code=status, headers=headers, reason=reason)
        for event in (response, h11.Data(data=body), h11.EndOfMessage()):
            data = self.conn.send(event)
            if data:
                self.transport.write(data)
        self._drain()

    def _refusal(self, msg: str) -> tuple[int, str]:
        """The status and detail for the request h11 refused."""
        refusal = self._h11.refusal
        if refusal is not None and refusal.error_status_hint == 431:
            return 431, (
                f"request head over this daemon's limit of {self.max_head:,} bytes "
                "(request line, headers and cookies together)"
            )
        return 400, f"malformed HTTP request: {refusal or msg}"

    def _drain(self) -> None:
        """Shut this side, then drop what the client still sends until it closes,
        within the drain bounds: a close with its data unread resets the connection
        under the answer."""
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self._closing = self.loop.call_later(DRAIN_SECONDS, self.transport.close)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, until a request was refused; after that, dropped and counted."""
        if self._closing is None:
            super().data_received(data)
            return
        self._dropped += len(data)
        if self._dropped > DRAIN_BYTES:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's, and the end of a drain."""
        if self._closing is not None:
            self._closing.cancel()
        super().connection_lost(exc)
