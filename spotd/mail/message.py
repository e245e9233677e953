"""Building a multipart message: text, HTML, inline PNG images."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.mail.common import PNG_SIGNATURE

log = logging.getLogger(__name__)


def build_message(
    subject: str,
    text: str,
    html: str | None,
    images: Mapping[str, bytes],
    *,
    sender: str,
    to: Sequence[str],
    clock: Clock = WALL,
) -> EmailMessage:
    """A multipart/alternative email: plain text, and HTML with its PNGs inline,
    dated by ``clock``.

    ``images`` maps a Content-ID (without angle brackets) to PNG bytes; the
    HTML refers to each as ``cid:<content-id>``. The HTML part becomes a
    multipart/related part carrying the images, the layout mail clients
    expect for inline pictures.
    """
    if not to:
        raise ValueError("an email needs at least one recipient")
    if images and html is None:
        raise ValueError("inline images need an HTML part")
    message = EmailMessage()
    message["Subject"] = subject
    message["From"] = sender
    message["To"] = ", ".join(to)
    message["Date"] = format_datetime(clock.now())
    # An explicit domain: make_msgid's default asks DNS for our FQDN, which can stall.
    message["Message-ID"] = make_msgid(domain=_domain_of(sender))
    message.set_content(text)
    if html is not None:
        message.add_alternative(html, subtype="html")
        _attach_images(message, html, images)
    return message


def _attach_images(message: EmailMessage, html: str, images: Mapping[str, bytes]) -> None:
    html_part = next(p for p in message.iter_parts() if p.get_content_type() == "text/html")
    for cid, png in images.items():
        if not png.startswith(PNG_SIGNATURE):
            raise ValueError(f"image {cid!r} is not a PNG")
        if f"cid:{cid}" not in html:
            log.warning("image %s is not referenced by the HTML part", cid)
        html_part.add_related(
            png,
            maintype="image",
            subtype="png",
            cid=f"<{cid}>",
            disposition="inline",
            filename=f"{cid.partition('@')[0]}.png",
        )


def _domain_of(address: str) -> str:
    domain = address.rpartition("@")[2].strip(" >")
    return domain or "spotd.local"


@dataclass(frozen=True, slots=True)
class Composed:
    """An email's content, before it has a sender and recipients."""

    subject: str
    text: str
    html: str | None = None
    images: Mapping[str, bytes] = field(default_factory=dict)
    """Content-ID -> PNG bytes, referenced in ``html`` as ``cid:<content-id>``."""

    def message(self, sender: str, to: Sequence[str], clock: Clock = WALL) -> EmailMessage:
        """The complete message, dated by ``clock``."""
        return build_message(self.subject, self.text, self.html, self.images, sender=sender,
                             to=to, clock=clock)  # fmt: skip
