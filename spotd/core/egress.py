"""Can nodes without a public address reach what a job needs? The typed finding of
``spotd check-cloud``'s egress check, worded the same for every provider.

A node without a public address reaches the internet only through a NAT (or a
firewall appliance its subnet routes to). Without one, a provider's private path
to its own object store (a gateway endpoint, private access to its APIs) still
serves checkpoints kept there, but the daemon and the package index stay out of
reach unless they sit inside the network. Each adapter finds out which way its
subnet offers; this module turns that into one :class:`CheckOutcome`.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from spotd.core.values import CheckOutcome, Reach

CHECKPOINT_URI_VAR = "SPOTD_CHECKPOINT_URI"
"""The launch request's variable naming the job's checkpoint URI."""

EGRESS = "egress"
"""Name prefix of the outcome: ``egress <subnet>``."""


def checkpoint_scheme(env: Mapping[str, str]) -> str | None:
    """The scheme of the request's checkpoint URI (``s3``, ``gs``...), "" for a path on
    the node, None when the request does not say (no job given)."""
    uri = env.get(CHECKPOINT_URI_VAR)
    if uri is None:
        return None
    if "::" in uri:
        # fsspec chains (``simplecache::s3://...``): the last link is the store.
        uri = uri.rsplit("::", 1)[-1]
    scheme = urlsplit(uri).scheme.lower()
    return "" if scheme in ("", "file") else scheme


def way_out(where: str, how: str) -> CheckOutcome:
    """A pass: the nodes of ``where`` get out ``how`` (a NAT gateway, an appliance...)."""
    return CheckOutcome(f"{EGRESS} {where}", True,
                        f"nodes without a public address get out through {how}")  # fmt: skip


def public_nodes(where: str, why: str) -> CheckOutcome:
    """A pass with nothing to check: the nodes have public addresses (``why``)."""
    return CheckOutcome(f"{EGRESS} {where}", True, f"nodes get a public address ({why})")


def no_way_out(
    where: str, *, fix: str, env: Mapping[str, str], store_path: str | None = None
) -> CheckOutcome:
    """A failure naming what the nodes of ``where`` cannot reach, and ``fix``.

    ``store_path`` is the private path to the checkpoint store the subnet has
    (already matched to the store's scheme by the caller), None when it has none.
    """
    missing = [Reach.DAEMON, Reach.PACKAGE_INDEX]
    scheme = checkpoint_scheme(env)
    if scheme != "" and store_path is None:
        missing.append(Reach.CHECKPOINT_STORE)
    detail = ("nodes without a public address have no way out: they cannot reach the "
              f"{_listed(missing)}")  # fmt: skip
    # The daemon may still be reachable privately; the check cannot tell from here.
    detail += " (the daemon unless it sits inside the network or one peered to it)"
    if store_path is not None:
        detail += f"; the checkpoint store is reachable through {store_path}"
    return CheckOutcome(f"{EGRESS} {where}", False, f"{detail}. {fix}", tuple(missing))


def _listed(items: list[Reach]) -> str:
    names = [str(i.value) for i in items]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
