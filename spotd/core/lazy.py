"""Provider adapters: the simulated market and the clouds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` loading each name from its submodule on first use.

    A cloud adapter's SDK is an extra: importing its package (for its
    settings, say) must not need the SDK, so the adapter loads when asked for.
    """

    def load(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(module, package), name)

    return load
