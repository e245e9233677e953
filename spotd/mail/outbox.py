"""The durable outbox: a message is a file until a server accepted it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import default as default_policy
from enum import Enum
from pathlib import Path

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import MailError
from spotd.files import write_atomic
from spotd.mail.smtp import MessageSender

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Pending:
    """A message waiting in the outbox, with its delivery history."""

    path: Path
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_error: str | None = None

    @property
    def meta_path(self) -> Path:
        """The JSON file beside the message that holds the retry state."""
        return self.path.with_suffix(".json")


class _Outcome(Enum):
    SENT = "sent"
    FAILED = "failed"
    STOP = "stop"


class Outbox:
    """A durable queue of outgoing messages: one ``.eml`` file each, written atomically.

    Files are named ``<UTC timestamp>-<uuid>.eml`` so that name order is
    age order. A message is deleted only after a successful send; a failed
    one gets a ``.json`` file beside it with its attempts and next-attempt
    time (exponential backoff). Flushes are serialised within a process by a
    lock and across processes (the daemon and ``spotd report --email``) by
    ``flock`` on ``.lock`` in the folder. ``clock`` stamps the files and the retries.
    """

    def __init__(
        self,
        folder: Path,
        *,
        base_delay_seconds: float = 60.0,
        max_delay_seconds: float = 3600.0,
        clock: Clock = WALL,
    ) -> None:
        self.folder = folder
        self._base = base_delay_seconds
        self._max = max_delay_seconds
        self._clock = clock
        self._lock = threading.Lock()

    def put(self, message: EmailMessage, *, now: datetime | None = None) -> Path:
        """Keep ``message`` for delivery; raises OSError if it cannot be written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        at = now or self._clock.now()
        path = self.folder / f"{at.astimezone(UTC):%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex}.eml"
        write_atomic(path, bytes(message))
        log.info("queued email %r to %s", message["Subject"], message["To"])
        return path

    def pending(self) -> list[Pending]:
        """The waiting messages, oldest first."""
        if not self.folder.is_dir():
            return []
        return [self._read_meta(p) for p in sorted(self.folder.glob("*.eml"))]

    def flush(self, sender: MessageSender, *, now: datetime | None = None) -> int:
        """Try to send every due message, oldest first; return how many were sent.

        Never raises: failures are logged and retried on a later flush. After
        a temporary failure (server unreachable) the round stops, since the
        next messages would only wait for the same timeout.
        """
        at = now or self._clock.now()
        try:
            with self._lock, self._folder_lock() as locked:
                return self._send_due(sender, at) if locked else 0
        except Exception:
            log.exception("outbox flush failed; the messages stay queued")
            return 0

    def _send_due(self, sender: MessageSender, now: datetime) -> int:
        sent = 0
        for item in self.pending():
            if item.next_attempt_at is not None and item.next_attempt_at > now:
                continue
            outcome = self._try(item, sender, now)
            if outcome is _Outcome.SENT:
                sent += 1
            elif outcome is _Outcome.STOP:
                break
        return sent

    def _try(self, item: Pending, sender: MessageSender, now: datetime) -> _Outcome:
        try:
            message = BytesParser(policy=default_policy).parsebytes(item.path.read_bytes())
        except FileNotFoundError:
            return _Outcome.FAILED  # another flush sent it meanwhile
        except OSError as exc:
            log.warning("cannot read queued email %s: %s", item.path.name, exc)
            return _Outcome.FAILED
        try:
            sender.send_message(message)
        except MailError as exc:
            self._failed(item, message, exc, now)
            return _Outcome.STOP if exc.retryable else _Outcome.FAILED
        except Exception as exc:  # a bug in a sender must not lose the message either
            self._failed(item, message, exc, now)
            return _Outcome.STOP
        self._remove(item)
        log.info("sent email %r to %s", message["Subject"], message["To"])
        return _Outcome.SENT

    def _failed(self, item: Pending, message: EmailMessage, exc: Exception, now: datetime) -> None:
        attempts = item.attempts + 1
        delay = min(self._max, self._base * 2 ** (attempts - 1))
        retry_at = now + timedelta(seconds=delay)
        log.warning(
            "could not send email %r (attempt %d, next try in %.0f s): %s: %s",
            message["Subject"],
            attempts,
            delay,
            type(exc).__name__,
            exc,
        )
        meta = {
            "attempts": attempts,
            "next_attempt_at": retry_at.isoformat(),
            "last_error": f"{type(exc).__name__}: {exc}",
        }
        try:
            write_atomic(item.meta_path, json.dumps(meta).encode())
        except OSError as err:
            log.warning("could not record the retry state of %s: %s", item.path.name, err)

    def _remove(self, item: Pending) -> None:
        try:
            item.path.unlink(missing_ok=True)
            item.meta_path.unlink(missing_ok=True)
        except OSError as exc:
            log.error("sent %s but could not remove it; it may be sent again: %s", item.path, exc)

    def _read_meta(self, path: Path) -> Pending:
        meta_path = path.with_suffix(".json")
        try:
            meta = json.loads(meta_path.read_text())
            return Pending(
                path,
                int(meta["attempts"]),
                datetime.fromisoformat(meta["next_attempt_at"]),
                meta.get("last_error"),
            )
        except FileNotFoundError:
            return Pending(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Unreadable retry state: try the message now rather than never.
            log.warning("ignoring bad retry state %s: %s", meta_path.name, exc)
            return Pending(path)

    @contextlib.contextmanager
    def _folder_lock(self) -> Iterator[bool]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / ".lock").open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False  # another process is flushing; it sends what is due
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
