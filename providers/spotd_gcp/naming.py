"""Deterministic names, request ids and labels for the VMs spotd launches.

- Name: ``spotd-<first 16 hex of sha256(client token)>-<node rank>``; it
  satisfies GCE's ``[a-z]([-a-z0-9]*[a-z0-9])?`` and 63 characters, and a
  retried launch finds the VMs of the first by name.
- Request id: a UUID5 of the token and rank, so that GCE itself drops a
  retried insert (it answers with the first operation).
- Labels: each spotd tag becomes a GCP label by :func:`label_key` /
  :func:`label_value`. GCP labels allow only ``[a-z0-9_-]``, lower case, at
  most 63 characters, keys starting with a letter, so the mapping is lossy;
  the exact tags are kept in the instance metadata (``spotd-tags``, JSON)
  and read back from there. Labels serve the server-side filter only.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping

NAME_PATTERN = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
MAX_NAME = 63
MAX_LABEL = 63
MAX_LABELS = 64

LAUNCH_LABEL = "spotd-launch"
"""Label on every spotd VM: the client token hash. Marks the VM as spotd's."""

REQUEST_ID_NAMESPACE = uuid.UUID("8d1f3c2e-5b7a-4c1e-9f0d-3a6b2e4c7d91")
"""Fixed UUID5 namespace of spotd's GCE request ids (an arbitrary constant)."""

_INVALID = re.compile(r"[^a-z0-9_-]")


def token_hash(client_token: str) -> str:
    """The first 16 hex digits of the SHA-256 of the client token."""
    return hashlib.sha256(client_token.encode()).hexdigest()[:16]


def instance_name(client_token: str, rank: int) -> str:
    """The VM name of node ``rank`` of the launch with this token."""
    name = f"spotd-{token_hash(client_token)}-{rank}"
    if len(name) > MAX_NAME or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"bad instance name {name!r}")
    return name


def request_id(client_token: str, rank: int) -> str:
    """The GCE ``requestId`` of that node's insert: stable across retries."""
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, f"{client_token}/{rank}"))


def _clean(text: str) -> str:
    return _INVALID.sub("_", text.lower())


def _fit(original: str, cleaned: str) -> str:
    """``cleaned``, with a hash of ``original`` when cleaning lost more than case."""
    if cleaned == original.lower() and len(cleaned) <= MAX_LABEL:
        return cleaned
    # Something was replaced or cut: a short hash keeps distinct tags apart.
    digest = hashlib.sha256(original.encode()).hexdigest()[:8]
    return f"{cleaned[: MAX_LABEL - 9]}-{digest}"


def label_key(key: str) -> str:
    """A GCP label key for a spotd tag key (lower case, starts with a letter)."""
    cleaned = _clean(key)
    if not cleaned or not cleaned[0].isalpha():
        cleaned = f"k{cleaned}"
        return _fit(f"k{key}", cleaned)
    return _fit(key, cleaned)


def label_value(value: str) -> str:
    """A GCP label value for a spotd tag value (may be empty)."""
    return _fit(value, _clean(value))


def labels_for(tags: Mapping[str, str], client_token: str) -> dict[str, str]:
    """The labels of a launch: the sanitised tags plus the token hash."""
    labels = {label_key(k): label_value(v) for k, v in tags.items()}
    labels[LAUNCH_LABEL] = token_hash(client_token)
    if len(labels) > MAX_LABELS:
        raise ValueError(f"{len(tags)} tags: GCP allows at most {MAX_LABELS - 1}")
    return labels


def label_filter(tags: Mapping[str, str]) -> str:
    """A compute ``filter`` expression matching VMs labelled with all ``tags``.

    Each clause is parenthesised; GCE ANDs them. Sanitised values hold no quote.
    """
    return " ".join(f'(labels.{label_key(k)} = "{label_value(v)}")' for k, v in tags.items())
