"""The documentation and deploy files agree with the code they describe."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from spotd.core.states import TRANSITIONS, FailureCause, JobStatus
from spotd.daemon.config import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIG_DOC = DOCS / "config.md"
ARCHITECTURE_DOC = DOCS / "architecture.md"
EXAMPLE_CONFIG = ROOT / "deploy" / "spotd.toml"

# [text](target) links, images included; the target ends at whitespace or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def settings_tree(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, bool]]:
    """(dotted name, is a table) for every field of ``model``, nested models included."""
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        annotation = field.annotation
        nested = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        yield dotted, nested
        if nested:
            yield from settings_tree(annotation, f"{dotted}.")


def setting_names(model: type[BaseModel]) -> list[str]:
    return [name for name, _ in settings_tree(model)]


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted(DOCS.glob("*.md"))]


def anchors(path: Path) -> set[str]:
    """GitHub-style anchors of the headings of a Markdown file."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    headings = re.findall(r"^#+\s+(.+?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def relative_links(path: Path) -> list[str]:
    """Link targets in ``path`` that point into the repository (code blocks skipped)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not EXTERNAL.match(t)]


def test_settings_are_walked_recursively() -> None:
    names = set(setting_names(Settings))
    assert {"daemon.port", "providers.sim", "providers.sim.speed"} <= names


@pytest.mark.parametrize("name", sorted(setting_names(Settings)))
def test_every_setting_is_documented(name: str) -> None:
    assert f"`{name}`" in CONFIG_DOC.read_text(encoding="utf-8"), (
        f"docs/config.md does not mention the setting `{name}`"
    )


def test_example_config_loads() -> None:
    settings = load_settings(EXAMPLE_CONFIG)
    assert settings.data_dir == Path("/var/lib/spotd")


def test_example_config_sets_every_table() -> None:
    text = EXAMPLE_CONFIG.read_text(encoding="utf-8")
    tables = [name for name, nested in settings_tree(Settings) if nested]
    # [providers] has no key of its own: [providers.sim] stands for it.
    missing = [t for t in tables if f"[{t}]" not in text and f"[{t}." not in text]
    assert not missing, f"deploy/spotd.toml has no table for {missing}"


@pytest.mark.parametrize("value", [*JobStatus, *FailureCause], ids=str)
def test_statuses_and_causes_are_documented(value: JobStatus | FailureCause) -> None:
    assert f"`{value}`" in ARCHITECTURE_DOC.read_text(encoding="utf-8")


def test_state_diagram_matches_transitions() -> None:
    text = ARCHITECTURE_DOC.read_text(encoding="utf-8")
    block = re.search(r"```mermaid\n(stateDiagram.*?)```", text, re.DOTALL)
    assert block is not None, "docs/architecture.md has no mermaid diagram"
    edges = set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", block.group(1), re.MULTILINE))
    expected = {(str(a), str(b)) for a, targets in TRANSITIONS.items() for b in targets}
    assert edges == expected, (
        f"diagram lacks {sorted(expected - edges)}, has extra {sorted(edges - expected)}"
    )


def test_transition_table_matches_transitions() -> None:
    text = ARCHITECTURE_DOC.read_text(encoding="utf-8")
    rows = dict(
        re.findall(
            r"^\| `(\w+)` \| ((?:`[\w-]+`(?:, )?)+|none \(terminal\)) \|$", text, re.MULTILINE
        )
    )
    for status, targets in TRANSITIONS.items():
        assert str(status) in rows, f"no row for {status} in the transition table"
        documented = set(re.findall(r"`([\w-]+)`", rows[str(status)]))
        assert documented == {str(t) for t in targets}, status


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path) if path else doc
        if not dest.exists():
            broken.append(target)
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"
