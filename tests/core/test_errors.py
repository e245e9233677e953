"""The error tree: every class has a code of its own and an HTTP status (spotd.daemon.problems)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from spotd.core import errors
from spotd.core.errors import (
    JobNotFound,
    ProviderError,
    SpotdError,
    StoreUnavailable,
    error_class,
    error_classes,
)
from spotd.daemon.problems import STATUS, status_of

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = {"spotd": ROOT, "providers": ROOT / "providers", "policies": ROOT / "policies"}
PACKAGES = {"spotd", "spotd_sim", "spotd_aws", "spotd_gcp", "spotd_azure", "spotd_policies"}
"""The shipped packages: a test's own subclasses are not walked."""
CODE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def _modules_with_classes() -> dict[str, set[str]]:
    """Each shipped module's name and the names of the bases of its classes."""
    found: dict[str, set[str]] = {}
    for top, base in SOURCE_ROOTS.items():
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            bases = {
                b.id if isinstance(b, ast.Name) else b.attr
                for node in ast.walk(ast.parse(path.read_text(), str(path)))
                if isinstance(node, ast.ClassDef)
                for b in node.bases
                if isinstance(b, ast.Name | ast.Attribute)
            }
            parts = path.relative_to(base).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = bases
    return found


def every_error_class() -> list[type[SpotdError]]:
    """Every subclass of SpotdError in spotd, the providers and the policies: the
    modules that subclass a known error class are imported until none is left."""
    modules = _modules_with_classes()
    known: set[str] = set()
    while {c.__name__ for c in error_classes()} != known:
        known = {c.__name__ for c in error_classes()}
        for name, bases in modules.items():
            if bases & known:
                importlib.import_module(name)
    shipped = [c for c in error_classes() if c.__module__.partition(".")[0] in PACKAGES]
    return sorted(shipped, key=lambda c: c.__name__)


def test_the_walk_finds_the_classes_defined_outside_the_tree_module() -> None:
    names = {c.__name__ for c in every_error_class()}
    assert {"WorkdirError", "ReportFailed", "TraceError", "StoreUnavailable"} <= names


def test_every_error_class_has_a_code_of_its_own_and_a_status() -> None:
    classes = every_error_class()
    by_code: dict[str, list[str]] = {}
    for cls in classes:
        by_code.setdefault(cls.error_code, []).append(cls.__qualname__)
        assert CODE.fullmatch(cls.error_code), (cls, cls.error_code)
        assert 400 <= status_of(cls) < 600, cls
    shared = {code: names for code, names in by_code.items() if len(names) > 1}
    assert not shared, shared


def test_each_class_of_the_tree_module_names_its_code() -> None:
    """Stable across a rename: the classes of spotd.core.errors set theirs themselves."""
    tree = [c for c in error_classes() if c.__module__ == errors.__name__]
    assert len(tree) > 30
    unnamed = [c.__name__ for c in tree if "error_code" not in c.__dict__]
    assert not unnamed


def test_a_class_elsewhere_without_a_code_gets_one_from_its_name() -> None:
    class TraceShelfMissingError(ProviderError):
        pass

    assert TraceShelfMissingError.error_code == "trace-shelf-missing-error"
    assert status_of(TraceShelfMissingError) == STATUS[ProviderError], "the nearest base's"
    assert error_class("trace-shelf-missing-error") is TraceShelfMissingError


def test_the_nearest_mapped_base_gives_the_status() -> None:
    class GoneQuietly(JobNotFound):
        pass

    assert status_of(GoneQuietly) == 404
    assert status_of(SpotdError) == 500


@pytest.mark.parametrize("code", ["job-not-found", "store-unavailable", "provider-capacity"])
def test_a_code_names_its_class(code: str) -> None:
    cls = error_class(code)
    assert cls is not None and cls.error_code == code
    assert error_class("no-such-code") is None


def test_a_store_fault_keeps_its_short_cause() -> None:
    fault = StoreUnavailable("the store is unavailable: database or disk is full",
                             cause="database or disk is full")  # fmt: skip
    assert fault.cause == "database or disk is full" and fault.job_id is None
