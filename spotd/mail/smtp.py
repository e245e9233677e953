"""Delivering a message over SMTP (STARTTLS or implicit TLS, optional login)."""

from __future__ import annotations

import logging
import smtplib
import ssl
from collections.abc import Mapping, Sequence
from email.message import EmailMessage
from typing import Protocol

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import ConfigError, MailAuthError, MailRefused, MailUnavailable
from spotd.mail.message import build_message
from spotd.mail.settings import EmailSettings

log = logging.getLogger(__name__)


class MessageSender(Protocol):
    """Anything that can deliver a finished message (SMTP, or a test double)."""

    def send_message(self, message: EmailMessage) -> None:
        """Deliver the message or raise :class:`MailError`."""
        ...


class SmtpNotifier:
    """Delivers email over SMTP (smtplib), one connection per message.

    Implements :class:`~spotd.core.contracts.Notifier` and :class:`MessageSender`.
    Every failure is raised as a :class:`MailError` subclass. ``clock`` dates what
    :meth:`send` builds.
    """

    def __init__(
        self,
        settings: EmailSettings,
        *,
        ssl_context: ssl.SSLContext | None = None,
        clock: Clock = WALL,
    ):
        if settings.host is None:
            raise ConfigError("email.host is not set: email is off")
        self._settings = settings
        self._host = settings.host
        self._ssl_context = ssl_context
        self._clock = clock

    def __repr__(self) -> str:
        s = self._settings
        return (
            f"SmtpNotifier(host={s.host!r}, port={s.effective_port}, security={s.security!r}, "
            f"username={s.username!r})"
        )

    def send(
        self,
        to: Sequence[str],
        subject: str,
        text: str,
        html: str | None = None,
        images: Mapping[str, bytes] | None = None,
    ) -> None:
        """Build the message and deliver it now."""
        message = build_message(
            subject, text, html, images or {}, sender=self._settings.sender, to=to,
            clock=self._clock,
        )
        self.send_message(message)

    def send_message(self, message: EmailMessage) -> None:
        """Deliver a finished message now."""
        try:
            with self._connect() as smtp:
                self._login(smtp)
                refused = smtp.send_message(message)
        except smtplib.SMTPAuthenticationError as exc:
            raise MailAuthError(f"{self._where()}: login refused: {_reply(exc)}") from None
        except smtplib.SMTPResponseException as exc:
            kind = MailUnavailable if 400 <= exc.smtp_code < 500 else MailRefused
            raise kind(f"{self._where()}: {_reply(exc)}") from None
        except smtplib.SMTPRecipientsRefused as exc:
            refused = exc.recipients
            raise MailRefused(f"{self._where()}: every recipient refused: {refused}") from None
        except smtplib.SMTPNotSupportedError as exc:
            raise MailRefused(f"{self._where()}: {exc}") from None
        except ssl.SSLError as exc:
            raise MailRefused(f"{self._where()}: TLS failed: {exc}") from None
        except (smtplib.SMTPException, OSError) as exc:
            raise MailUnavailable(f"{self._where()}: {type(exc).__name__}: {exc}") from None
        if refused:
            # Some recipients took it: a retry would send it to them twice.
            log.warning("%s refused %d recipient(s): %s", self._where(), len(refused), refused)

    def _connect(self) -> smtplib.SMTP:
        s = self._settings
        if s.security == "tls":
            return smtplib.SMTP_SSL(
                self._host, s.effective_port, timeout=s.timeout_seconds, context=self._context()
            )
        smtp = smtplib.SMTP(self._host, s.effective_port, timeout=s.timeout_seconds)
        if s.security == "starttls":
            try:
                smtp.starttls(context=self._context())
                smtp.ehlo()
            except BaseException:
                smtp.close()
                raise
        return smtp

    def _login(self, smtp: smtplib.SMTP) -> None:
        s = self._settings
        if s.username is None:
            return
        password = s.password.get_secret_value() if s.password is not None else ""
        smtp.login(s.username, password)

    def _context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            ca = self._settings.ca_file
            self._ssl_context = ssl.create_default_context(cafile=str(ca) if ca else None)
        return self._ssl_context

    def _where(self) -> str:
        return f"SMTP {self._host}:{self._settings.effective_port}"


def _reply(exc: smtplib.SMTPResponseException) -> str:
    detail = exc.smtp_error
    text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
    return f"{exc.smtp_code} {text}"
