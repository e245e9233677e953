"""The package's shape holds: no import cycle, a short top level, unique class names, and
docs/architecture.md names only packages, modules and paths that exist."""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("spotd", "providers", "policies")
PACKAGES = ("spotd", "spotd_sim", "spotd_aws", "spotd_gcp", "spotd_azure", "spotd_policies")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _shipped_files() -> list[Path]:
    return [p for d in SOURCE_ROOTS for p in sorted((ROOT / d).rglob("*.py"))]


def _cycles(graph: grimp.ImportGraph) -> set[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph.find_modules_directly_imported_by(module):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                found.add(frozenset(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_in_any_shipped_package_counting_type_checking_imports() -> None:
    # One graph over every shipped package: a circle within a provider or across
    # packages is as much a cycle as one inside spotd. Imports inside functions count
    # too: a kind may load its adapter lazily (for the SDK), so nothing the adapter
    # imports may import the kind.
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    cycles = _cycles(graph)
    assert not cycles, f"import cycles: {sorted(sorted(c) for c in cycles)}"


def test_a_short_top_level() -> None:
    modules = sorted(p.name for p in (ROOT / "spotd").glob("*.py"))
    assert len(modules) <= 12, modules


def test_no_two_classes_share_a_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in _shipped_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, shared


MAX_METHODS = 25
MAX_ENGINE_LINES = 500


def test_no_class_in_spotd_is_a_god_object() -> None:
    """A class with more than about 25 methods does too many things to read as one."""
    big = {}
    for path in sorted((ROOT / "spotd").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body
                           if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]  # fmt: skip
                if len(methods) > MAX_METHODS:
                    big[f"{path.relative_to(ROOT)}:{node.name}"] = len(methods)
    assert not big, big


def test_no_engine_module_is_long() -> None:
    long = {p.name: n for p in (ROOT / "spotd" / "engine").glob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_ENGINE_LINES}  # fmt: skip
    assert not long, long


def _resolves(dotted: str) -> bool:
    """A module, or an attribute of the longest module prefix of ``dotted``."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_architecture_page_names_what_exists() -> None:
    text = ARCHITECTURE.read_text()
    quoted = set(re.findall(r"`([^`\s]+)`", text))
    dotted = {q.rstrip("()") for q in quoted if re.fullmatch(r"spotd(_\w+)?(\.\w+)*(\(\))?", q)}
    paths = {q for q in quoted if re.fullmatch(r"(spotd|providers|policies|tests)/[\w/.]*", q)}
    assert len(dotted) > 20 and len(paths) > 10, "the page should map the code"
    groups = {"spotd.policies", "spotd.providers"}  # entry-point groups, not modules
    missing = sorted(d for d in dotted - groups if not _resolves(d))
    missing += sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing
    # Every package of spotd/ is on the map, the folder layout's tree.
    tree = text.split("## Folder layout", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    for package in sorted(p.parent for p in (ROOT / "spotd").glob("*/__init__.py")):
        assert f"  {package.name}/" in tree, f"spotd/{package.name}/ is not on the map"


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in (("a.x", "a.y"), ("a.y", "a.z"), ("a.z", "a.x"), ("a.z", "a.w")):
        graph.add_import(importer=importer, imported=imported)
    assert _cycles(graph) == {frozenset({"a.x", "a.y", "a.z"})}
