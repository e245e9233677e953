"""Finding policies and providers by name through entry points.

Third parties add a policy by declaring it in the ``spotd.policies`` entry
point group of their own package; nothing here needs to change.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from spotd.contracts import Policy
from spotd.errors import PolicyError

POLICY_GROUP = "spotd.policies"


def policy_names() -> list[str]:
    """Names of every installed policy."""
    return sorted(ep.name for ep in entry_points(group=POLICY_GROUP))


def load_policy(name: str) -> Policy:
    """An instance of the policy registered under ``name``."""
    matches = [ep for ep in entry_points(group=POLICY_GROUP) if ep.name == name]
    if not matches:
        known = ", ".join(policy_names()) or "none"
        raise PolicyError(f"no policy named {name!r} (installed: {known})")
    try:
        factory = matches[0].load()
        policy: Policy = factory()
    except Exception as exc:
        raise PolicyError(f"policy {name!r} failed to load: {exc}") from exc
    return policy
