"""Shipping the node's output (:class:`~spotd.agent.output.NodeOutput`) to the daemon.

Every ``SPOTD_AGENT_LOG_SECONDS`` the shipper sends what the output holds past
what the daemon acknowledged, in chunks of at most
:data:`~spotd.core.agent_wire.MAX_LOG_CHUNK` bytes, each with its byte offset. The
offset makes every send safe to repeat: a chunk whose answer was lost is sent
again and the daemon keeps its bytes once; a daemon that holds less than the
agent thinks (409) says from where, and the agent sends again from there. A
failed send (daemon down, 5xx) waits a backoff that doubles up to
``SPOTD_AGENT_RETRY_MAX_SECONDS``, as reports do; the output waits on the node
meanwhile, nothing is lost. At the job's end the agent flushes what is left
before it reports the exit (:meth:`LogShipper.flush`), so a daemon that sees
the job end has its whole output.

Time is the shipper's ``clock``: :meth:`LogShipper.pump` does one round and never
waits, so a test drives it round by round with a manual clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from enum import Enum

from spotd.agent.output import AgentLines, NodeOutput
from spotd.agent.reporter import ChunkTooLarge, ReportFailed, ReportRejected
from spotd.core.agent_wire import MAX_LOG_CHUNK, LogChunk, LogGap
from spotd.core.clock import WALL
from spotd.core.contracts import Clock

log = logging.getLogger(__name__)

Ship = Callable[[LogChunk], int]
"""Sends one chunk; the end of what the daemon holds (see ``DaemonReporter.ship``)."""
Speaker = Callable[[], dict[str, object]]
"""The fields a chunk starts with: who speaks, and when (``AgentConfig.speaker``)."""

MIN_CHUNK = 1024
"""Chunks are halved on a 413 down to this; a daemon that takes none so small is given up."""


class ShipRound(Enum):
    """How a round of shipping ended."""

    CAUGHT_UP = "caught-up"
    """The daemon holds everything written when the round began."""
    BEHIND = "behind"
    """A send failed: the rest waits for the backoff."""
    STOPPED = "stopped"
    """The daemon refused for good (unknown attempt, no log route): no more sends."""


class LogShipper:
    """Ships one node's output, from its start, to the daemon (see the module)."""

    def __init__(
        self,
        output: NodeOutput,
        ship: Ship,
        speaker: Speaker,
        *,
        clock: Clock = WALL,
        initial_backoff: float = 0.5,
        max_backoff: float = 30.0,
        chunk_bytes: int = MAX_LOG_CHUNK,
    ) -> None:
        self._output = output
        self._ship = ship
        self._speaker = speaker
        self._clock = clock
        self._initial = initial_backoff
        self._max = max_backoff
        self._backoff = initial_backoff
        self._chunk = max(MIN_CHUNK, min(chunk_bytes, MAX_LOG_CHUNK))
        self._retry_at: float | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self.shipped = 0
        """Bytes of the output the daemon holds, as it last said."""

    def pump(self) -> ShipRound:
        """One round: echo what is new, then send what the daemon lacks of what is
        written now, chunk by chunk, unless a failure's backoff still runs."""
        with self._lock:
            self._output.echo_new()
            if self._stopped:
                return ShipRound.STOPPED
            if self._retry_at is not None and self._clock.monotonic() < self._retry_at:
                return ShipRound.BEHIND
            target = self._output.size()
            # Bounded: a daemon that keeps sending it back cannot hold the round forever.
            for _ in range(target // self._chunk + 8):
                if self.shipped >= target:
                    return ShipRound.CAUGHT_UP
                outcome = self._send(self._output.read(self.shipped, self._chunk))
                if outcome is not None:
                    return outcome
            return ShipRound.BEHIND

    def run(self, stop: threading.Event, every: float) -> None:
        """Pump every ``every`` seconds until ``stop`` is set (the shipping thread)."""
        while not stop.is_set():
            try:
                self.pump()
            except Exception:
                # A bug here must not end the shipping: the next round tries again.
                log.exception("shipping the node's output failed unexpectedly")
            stop.wait(every)

    def flush(
        self, timeout: float, stop: threading.Event, pause: Callable[[float], object]
    ) -> bool:
        """Pump until the daemon holds everything written, for at most ``timeout`` s
        of the clock, or until ``stop`` is set; whether it holds it all.
        ``pause(seconds)`` waits between two rounds (``stop.wait``, for the agent)."""
        deadline = self._clock.monotonic() + timeout
        while True:
            outcome = self.pump()
            if outcome is not ShipRound.BEHIND:
                return outcome is ShipRound.CAUGHT_UP
            left = deadline - self._clock.monotonic()
            if left <= 0 or stop.is_set():
                return False
            pause(min(left, self._wait_left()))

    def _wait_left(self) -> float:
        """Seconds until the backoff ends (a short beat when none runs)."""
        if self._retry_at is None:
            return 0.05
        return max(0.0, self._retry_at - self._clock.monotonic())

    def _send(self, data: bytes) -> ShipRound | None:
        """Send ``data`` from :attr:`shipped` on; None when the round may go on."""
        chunk = LogChunk(offset=self.shipped, data=data, **self._speaker())
        try:
            end = self._ship(chunk)
        except LogGap as gap:
            return self._resend_from(gap.expected)
        except ChunkTooLarge:
            return self._smaller()
        except ReportRejected as exc:
            log.error("the daemon refused the node's output; no more is sent: %s", exc)
            self._stopped = True
            return ShipRound.STOPPED
        except ReportFailed as exc:
            self._fail(str(exc))
            return ShipRound.BEHIND
        except Exception as exc:
            log.exception("sending the node's output failed unexpectedly")
            self._fail(repr(exc))
            return ShipRound.BEHIND
        if self._retry_at is not None:
            log.info("the node's output reaches the daemon again")
        self._retry_at, self._backoff = None, self._initial
        return self._held(end)

    def _held(self, end: int) -> ShipRound | None:
        """The daemon holds the output up to ``end``."""
        if end > self._output.size():
            return self._beyond(end)
        self.shipped = end
        return None

    def _resend_from(self, expected: int) -> ShipRound | None:
        """A 409: the daemon holds up to ``expected``; send from there."""
        if expected > self._output.size():
            return self._beyond(expected)
        log.info("the daemon holds the node's output up to byte %d; sending from there",
                 expected)  # fmt: skip
        self.shipped = expected
        return None

    def _beyond(self, end: int) -> ShipRound:
        log.error("the daemon holds %d bytes of this node's output, more than the node "
                  "has; no more is sent", end)  # fmt: skip
        self._stopped = True
        return ShipRound.STOPPED

    def _smaller(self) -> ShipRound | None:
        if self._chunk <= MIN_CHUNK:
            log.error("the daemon takes no chunk of output of %d bytes; no more is sent",
                      self._chunk)  # fmt: skip
            self._stopped = True
            return ShipRound.STOPPED
        self._chunk = max(MIN_CHUNK, self._chunk // 2)
        log.warning("the daemon refused a chunk of output as too large; sending %d bytes "
                    "at a time", self._chunk)  # fmt: skip
        return None

    def _fail(self, why: str) -> None:
        """Wait a backoff before the next send; warn once per streak of failures."""
        if self._retry_at is None:
            log.warning("the node's output did not reach the daemon, will retry: %s", why)
        self._retry_at = self._clock.monotonic() + self._backoff
        self._backoff = min(self._max, self._backoff * 2)


class OutputShipping:
    """The node's output for the job's run: its file in the run folder, the agent's own
    lines into it (through ``lines``, when given), and the thread that ships it every
    ``every`` seconds until ``stop`` is set."""

    def __init__(
        self,
        output: NodeOutput,
        shipper: LogShipper,
        *,
        every: float,
        stop: threading.Event,
        lines: AgentLines | None = None,
    ) -> None:
        self.output = output
        self.shipper = shipper
        self._lines = lines
        self._thread = threading.Thread(target=shipper.run, args=(stop, every),
                                        name="spotd-agent-logs", daemon=True)  # fmt: skip

    def start(self) -> None:
        """The agent's lines into the output, and the shipping thread running."""
        if self._lines is not None:
            self._lines.attach(self.output)
        self._thread.start()

    def finish(self, timeout: float, leaving: threading.Event) -> bool:
        """Once the job ended (its ``stop`` set): ship the rest alone, for at most
        ``timeout`` seconds or until ``leaving`` is set, then close the output; whether
        the daemon holds it all."""
        if self._thread.is_alive():
            self._thread.join()
        done = self.shipper.flush(timeout, leaving, leaving.wait)
        self.close()
        if not done:  # to the node's log: the output is closed
            log.warning("the daemon holds %d of the %d bytes of the node's output; the "
                        "node's log has them all", self.shipper.shipped,
                        self.output.size())  # fmt: skip
        return done

    def close(self) -> None:
        """The agent's lines back to stderr, and the output closed (idempotent)."""
        if self._lines is not None:
            self._lines.attach(None)
        self.output.close()
