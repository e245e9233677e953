"""The dashboard's login session: a signed cookie, and the checks on its state changes.

The cookie never holds the API token. It holds an expiry, a random session id
and an HMAC of both keyed by the token, so any daemon that shares the token
(several daemons on one database) accepts it, and changing the token ends every
session. The HMAC is compared in constant time, as the token is at login. A
logout records the session id in the store (:class:`~spotd.core.contracts.SessionStore`)
until the cookie expires: a copy of the cookie, kept elsewhere, is refused from
then on by every daemon on the database.

A browser sends the cookie only to this site (``SameSite=Strict``), never to
scripts (``HttpOnly``) and only over a secure context (``Secure``: HTTPS, or a
loopback address, which Chromium and Firefox treat as secure). The two routes
that change state, login and logout, also check that the request comes from a
page of this site (:func:`same_origin`) and carry a form token
(:func:`login_form_token`, :func:`logout_form_token`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

from spotd.core.clock import WALL
from spotd.core.contracts import Clock, SessionStore
from spotd.core.errors import StoreError

log = logging.getLogger(__name__)

SESSION_COOKIE = "spotd_session"
"""The cookie that holds a signed session."""
LOGIN_COOKIE = "spotd_login"
"""The cookie that pairs a login form with the browser that asked for it."""
SESSION_SECONDS = 12 * 3600
"""How long a login lasts."""
COOKIE_PATH = "/dashboard"
"""The cookies are sent to the dashboard's routes only, never to the JSON API."""
_SESSION_PURPOSE = b"spotd-dashboard-session:"
_LOGOUT_PURPOSE = b"spotd-dashboard-logout:"


@dataclass(frozen=True)
class Sessions:
    """Signs and checks session cookies with the API token as the key; ``ended``
    holds the sessions logged out of; ``clock`` (the wall's) dates their expiry."""

    token: str
    ended: SessionStore
    clock: Clock = WALL

    def issue(self, now: float | None = None) -> str:
        """A new session's cookie value: ``<expiry>.<session id>.<hmac>``."""
        expiry = int((self._now() if now is None else now) + SESSION_SECONDS)
        signed = f"{expiry}.{secrets.token_hex(16)}"
        return f"{signed}.{self._sign(_SESSION_PURPOSE, signed)}"

    def valid(self, value: str | None, now: float | None = None) -> bool:
        """Whether ``value`` is a session this token signed, not expired and not
        logged out of. The store is asked last: a forged or stale cookie costs no read."""
        parts = _parts(value)
        if parts is None:
            return False
        expiry, session_id, signature = parts
        expected = self._sign(_SESSION_PURPOSE, f"{expiry}.{session_id}")
        fresh = expiry > (self._now() if now is None else now)
        if not (hmac.compare_digest(signature, expected) and fresh):
            return False
        try:
            return not self.ended.session_ended(session_id)
        except StoreError as exc:
            # Refused, not let in: whether it was logged out of is not known.
            log.warning("dashboard session not checked, the store failed: %s", exc)
            return False

    def end(self, value: str) -> None:
        """Log out of the session ``value`` (a valid one) wherever its cookie is."""
        parts = _parts(value)
        assert parts is not None, "only a valid session is ended"
        expiry, session_id, _ = parts
        self.ended.end_session(session_id, until=datetime.fromtimestamp(expiry, UTC))

    def logout_form_token(self, session: str) -> str:
        """The form token of the logout button: bound to the session it ends."""
        return self._sign(_LOGOUT_PURPOSE, session)

    def logout_allowed(self, session: str | None, form_token: str) -> bool:
        """Whether a logout carries its session's form token."""
        if session is None or not self.valid(session):
            return False
        return hmac.compare_digest(form_token, self.logout_form_token(session))

    def _now(self) -> float:
        """POSIX seconds now, as the cookie's expiry is written."""
        return self.clock.now().timestamp()

    def token_matches(self, given: str) -> bool:
        """Whether ``given`` is the API token, in constant time."""
        return hmac.compare_digest(given.encode(), self.token.encode())

    def _sign(self, purpose: bytes, message: str) -> str:
        mac = hmac.new(self.token.encode(), purpose + message.encode(), hashlib.sha256)
        return mac.hexdigest()


def _parts(value: str | None) -> tuple[int, str, str] | None:
    """A session cookie's expiry, session id and signature; None if it has not that shape."""
    if not value or value.count(".") != 2:
        return None
    expiry, session_id, signature = value.split(".")
    if not expiry.isdigit() or not session_id or not signature:
        return None
    return int(expiry), session_id, signature


def login_form_token() -> str:
    """A fresh random value for the login form and its :data:`LOGIN_COOKIE` (a
    double submit: a page elsewhere can neither read the cookie nor set it)."""
    return secrets.token_urlsafe(24)


def login_form_matches(cookie: str | None, field: str) -> bool:
    """Whether the login form's token is the one its browser's cookie holds."""
    return bool(cookie) and bool(field) and hmac.compare_digest(str(cookie), field)


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether a state-changing request comes from a page of this site.

    The browser's ``Origin`` (or, where it sends none, its ``Referer``) must name
    the host the request was sent to; a request with neither is refused. Only
    the host and port are compared: behind a TLS proxy the daemon sees http
    while the browser says https.
    """
    host = headers.get("host", "")
    source = headers.get("origin") or headers.get("referer")
    if not host or not source or source == "null":
        return False
    return urlsplit(source).netloc == host


def safe_next(path: str | None, default: str) -> str:
    """Where to go after the login: a path of the dashboard only, never another site."""
    if path and path.startswith(f"{COOKIE_PATH}/") and "//" not in path and "\\" not in path:
        return path
    return default
