"""API endpoint overrides in provider settings: ``http://`` on loopback only.

An endpoint override points an SDK at another server: a fake in tests, a
private endpoint in production. A plain ``http://`` one would send the
provider's bearer tokens in clear text, so only a loopback fake may use one.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["LOOPBACK_HOSTS", "checked_endpoint"]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def checked_endpoint(value: str | None) -> str | None:
    """``value`` without a trailing ``/``; ValueError for anything but an http(s) URL with a
    host, or an ``http://`` one off loopback. None stays None (no override)."""
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"endpoint must be an http(s) URL, got {value!r}")
    if parts.scheme == "http" and parts.hostname not in LOOPBACK_HOSTS:
        raise ValueError(f"http:// endpoints are allowed only on loopback, got {value!r}")
    return value.rstrip("/")
