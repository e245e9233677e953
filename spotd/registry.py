"""Finding policies and provider kinds by name through entry points.

Third parties add a policy by declaring it in the ``spotd.policies`` entry
point group of their own package, and a provider kind by declaring its
:class:`~spotd.core.kinds.ProviderKind` in the ``spotd.providers`` group; nothing
here needs to change. The shipped kinds are declared the same way.

Provider kinds are read from the entry points once per process. A lookup by
kind name loads only that kind; a lookup by provider name loads every kind.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from importlib.util import find_spec
from typing import TYPE_CHECKING

from spotd.core.errors import (
    PolicyError,
    ProviderKindError,
    ProviderSdkMissing,
    UnknownProviderKind,
)
from spotd.core.kinds import AnyKind, ProviderKind

if TYPE_CHECKING:
    from spotd.core.contracts import Policy

POLICY_GROUP = "spotd.policies"
PROVIDER_GROUP = "spotd.providers"


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


@cache
def _kind_entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=PROVIDER_GROUP):
        # An editable install seen twice on sys.path lists the same point twice.
        found.setdefault(ep.name, ep)
    return found


def kind_names() -> list[str]:
    """Names of every installed provider kind (``[providers.<name>]`` tables)."""
    return sorted(_kind_entry_points())


def _installed() -> str:
    return ", ".join(kind_names()) or "none"


@cache
def load_kind(name: str) -> AnyKind:
    """The descriptor of the provider kind named ``name``.

    Raises UnknownProviderKind when none is installed under that name, and
    ProviderKindError when its entry point does not load a valid descriptor.
    """
    ep = _kind_entry_points().get(name)
    if ep is None:
        raise UnknownProviderKind(f"no provider kind named {name!r} (installed: {_installed()})")
    try:
        kind = ep.load()
    except Exception as exc:
        raise ProviderKindError(
            f"provider kind {name!r} ({ep.value}) failed to load: {exc}"
        ) from exc
    problem = _invalid(name, kind)
    if problem:
        raise ProviderKindError(f"provider kind {name!r} ({ep.value}): {problem}")
    descriptor: AnyKind = kind
    return descriptor


def _invalid(name: str, kind: object) -> str:
    """What is wrong with an entry point's object as the descriptor of kind ``name``."""
    if not isinstance(kind, ProviderKind):
        return f"is a {type(kind).__name__}, not a spotd.core.kinds.ProviderKind"
    if kind.name != name:
        return f"the descriptor is named {kind.name!r}, its entry point {name!r}"
    if not name.isidentifier():
        return "a kind's name must be an identifier: it names a table and variables"
    if "enabled" not in kind.settings.model_fields:
        return f"its settings model {kind.settings.__name__} has no 'enabled' field"
    return ""


@cache
def provider_kinds() -> tuple[AnyKind, ...]:
    """Every installed provider kind, by name; raises when one fails to load or two
    claim the same provider name."""
    kinds = tuple(load_kind(name) for name in kind_names())
    owner: dict[str, str] = {}
    for kind in kinds:
        for provider in kind.names:
            if provider in owner:
                raise ProviderKindError(
                    f"provider {provider!r} is claimed by kinds {owner[provider]!r} "
                    f"and {kind.name!r}"
                )
            owner[provider] = kind.name
    return kinds


@cache
def _owners() -> dict[str, AnyKind]:
    return {provider: kind for kind in provider_kinds() for provider in kind.names}


def find_kind_of(provider: str) -> AnyKind | None:
    """The kind that builds the provider named ``provider``; None when none does."""
    return _owners().get(provider)


def kind_of(provider: str) -> AnyKind:
    """The kind that builds the provider named ``provider``; UnknownProviderKind if none."""
    kind = find_kind_of(provider)
    if kind is None:
        raise UnknownProviderKind(
            f"no installed provider kind builds a provider named {provider!r} "
            f"(installed kinds: {_installed()})"
        )
    return kind


def find_market_kind(provider: str) -> AnyKind | None:
    """The kind whose market figures (billing, egress, notice, instance types) apply to
    ``provider``: the kind it mirrors (``sim-aws``: AWS), else its own; None for a
    provider no installed kind builds."""
    kind = find_kind_of(provider)
    if kind is None:
        return None
    mirrored = kind.mirrors.get(provider)
    return kind if mirrored is None else load_kind(mirrored)


def require_sdk(kind: AnyKind) -> None:
    """Raise ProviderSdkMissing when a module of ``kind``'s SDK is not installed."""
    for module in kind.sdk.modules if kind.sdk is not None else ():
        try:
            found = find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing too
            found = False
        if not found:
            raise sdk_missing(kind, module)


def sdk_missing(kind: AnyKind, module: str) -> ProviderSdkMissing:
    """The error of ``kind`` enabled without ``module``, saying what to install."""
    return ProviderSdkMissing(
        f"[providers.{kind.name}] is enabled but its SDK is not installed "
        f"(no module named {module!r}): {_install_hint(kind, module)}"
    )


def _install_hint(kind: AnyKind, module: str) -> str:
    """What installs ``kind``'s SDK: the extra of the distribution declaring the kind."""
    ep = _kind_entry_points().get(kind.name)
    dist = ep.dist.name if ep is not None and ep.dist is not None else None
    if kind.sdk is None or dist is None:
        return f"install the package that provides {module.partition('.')[0]!r}"
    return f"pip install '{dist}[{kind.sdk.extra}]'"
