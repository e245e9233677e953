"""README.md and docs/ are reference for users: no history, and what they name exists.

History belongs to git and CHANGELOG.md, not to the pages a newcomer reads:
these tests refuse commit hashes, "issue N", "added for", run-by-run dates and
"session" used as a work session. They also check that every module, path and
setting the pages name is real, and that docs/config.md documents exactly the
settings the models have, so a setting added or renamed in code fails here
until the page follows.
"""

from __future__ import annotations

import re
import tomllib
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from spotd.daemon.config import Settings
from spotd.registry import POLICY_GROUP, PROVIDER_GROUP

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CONFIG_DOC = DOCS / "config.md"
ARCHITECTURE_DOC = DOCS / "architecture.md"
BENCHMARKS_DOC = DOCS / "benchmarks.md"
README_MAX_LINES = 120

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
ISO_DATE = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blank(match: re.Match[str]) -> str:
    """The match replaced by spaces, its newlines kept, so line numbers still hold."""
    return re.sub(r"[^\n]", " ", match.group(0))


def without_fences(text: str) -> str:
    return FENCE.sub(blank, text)


def prose(text: str) -> str:
    """The text without code blocks and inline code: what is read as sentences."""
    return INLINE_CODE.sub(blank, without_fences(text))


def line_of(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


@dataclass(frozen=True)
class Finding:
    """A phrase a page should not carry, with where it is."""

    page: str
    line: int
    found: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.found!r}"


def findings(path: Path, pattern: re.Pattern[str], text: str) -> list[Finding]:
    return [
        Finding(page_id(path), line_of(text, m.start()), m.group(0)) for m in pattern.finditer(text)
    ]


# --- history -------------------------------------------------------------------------

# A git hash: 7 to 40 hex digits standing alone (not the tail of an id such as
# `ami-0123...` or `j-3f2a...`, not part of a longer hex run such as a sha256),
# with both a digit and a letter, so that numbers and words like "decade" pass.
COMMIT_HASH = re.compile(r"(?<![\w./:=+-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")

HISTORY = re.compile(
    r"\bissues?\s+#?\d+"
    r"|(?<![\w&/])#\d+\b"
    r"|\badded\s+(?:in|for|on|since)\b"
    r"|\b(?:before|after|since)\s+(?:this|that)\s+(?:change|commit|fix|release)\b"
    r"|\b(?:at|on|before|after)\s+commit\b"
    r"|\bmeasured\s+(?:on|in)\s+(?:the\s+)?(?:19|20)\d\d\b"
    r"|\b(?:January|February|March|April|May|June|July|August|September|October"
    r"|November|December)\s+(?:\d{1,2},?\s+)?(?:19|20)\d\d\b",
    re.IGNORECASE,
)

SESSION = re.compile(r"\bsessions?\b", re.IGNORECASE)
# "session" is history ("session 5", "other sessions' test suites") unless its
# sentence is about one of these technical sessions: a login, cookie or token session,
# a process session (setsid), a cloud SDK's or metadata service's session, a
# recorded NVML session, SSH.
TECHNICAL_SESSION = re.compile(
    r"cookie|log(?:ged|s)?[ -]?(?:in|out)|dashboard|token|setsid|of (?:its|their) own"
    r"|NVML|IMDS|boto3|botocore|SSH",
    re.IGNORECASE,
)
SESSION_CONTEXT = 100


def sentence_around(text: str, at: int) -> str:
    start = max(text.rfind(". ", 0, at), text.rfind("\n\n", 0, at), at - SESSION_CONTEXT)
    ends = [e for e in (text.find(". ", at), text.find("\n\n", at)) if e != -1]
    end = min([*ends, at + SESSION_CONTEXT])
    return text[max(start, 0) : end]


def history_sessions(path: Path, text: str) -> list[Finding]:
    return [
        Finding(page_id(path), line_of(text, m.start()), sentence_around(text, m.start()))
        for m in SESSION.finditer(text)
        if not TECHNICAL_SESSION.search(sentence_around(text, m.start()))
    ]


def benchmark_date_cells(text: str) -> set[int]:
    """Offsets of dates that are the whole cell of a ``date`` column in a table."""
    allowed: set[int] = set()
    date_column: int | None = None
    offset = 0
    for line in text.splitlines(keepends=True):
        # (start, text) of each cell between the row's pipes
        cells = [(m.start(1), m.group(1)) for m in re.finditer(r"(?<=\|)([^|\n]*)(?=\|)", line)]
        names = [c.strip().lower() for _, c in cells]
        if not line.lstrip().startswith("|"):
            date_column = None
        elif date_column is None and "date" in names:
            date_column = names.index("date")
        elif date_column is not None and date_column < len(cells):
            start, cell = cells[date_column]
            if ISO_DATE.fullmatch(cell.strip()):
                allowed.add(offset + start + len(cell) - len(cell.lstrip()))
        offset += len(line)
    return allowed


def dated_prose(path: Path, text: str) -> list[Finding]:
    allowed = benchmark_date_cells(text) if path == BENCHMARKS_DOC else set()
    return [
        Finding(page_id(path), line_of(text, m.start()), m.group(0))
        for m in ISO_DATE.finditer(text)
        if m.start() not in allowed
    ]


@pytest.mark.parametrize("path", pages(), ids=page_id)
def test_no_commit_hashes(path: Path) -> None:
    found = findings(path, COMMIT_HASH, without_fences(path.read_text(encoding="utf-8")))
    assert not found, "commit hashes are history, not reference:\n" + "\n".join(map(str, found))


@pytest.mark.parametrize("path", pages(), ids=page_id)
def test_no_history_phrases(path: Path) -> None:
    text = prose(path.read_text(encoding="utf-8"))
    found = findings(path, HISTORY, text) + history_sessions(path, text)
    assert not found, "history belongs in git and CHANGELOG.md:\n" + "\n".join(map(str, found))


@pytest.mark.parametrize("path", pages(), ids=page_id)
def test_no_dated_figures(path: Path) -> None:
    found = dated_prose(path, prose(path.read_text(encoding="utf-8")))
    assert not found, (
        "dates outside code and outside a benchmark table's date column:\n"
        + "\n".join(map(str, found))
    )


def test_history_patterns_catch_history() -> None:
    assert COMMIT_HASH.search("measured at c7d533f on the quiet machine")
    assert not COMMIT_HASH.search("ami-0123456789abcdef0, j-3f2a9c01b4, 1048576, decade")
    assert not COMMIT_HASH.search("sha256:" + "ab12" * 16)
    assert HISTORY.search("Added 2026-12-03 for issue 22")
    assert HISTORY.search("the limit added for #31")
    assert not HISTORY.search("an issue with the 2 nodes")
    text = "Session 5 of that day: 85 ms. The dashboard's session is a signed cookie."
    assert [f.line for f in history_sessions(README, text)] == [1]


def test_dates_allowed_in_benchmark_date_cells_only() -> None:
    table = "| date | machine |\n|---|---|\n| 2026-12-03 | 2 cores |\n\non 2026-12-03"
    allowed = benchmark_date_cells(table)
    dates = [m.start() for m in ISO_DATE.finditer(table)]
    assert [d in allowed for d in dates] == [True, False]


def test_readme_fits_on_one_screen() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}"


# --- modules and paths ------------------------------------------------------------------

REPO_PATH = re.compile(
    r"(?<![\w/.~<>-])((?:spotd|providers|policies|tests|benchmarks|scenarios|examples|deploy)"
    r"/[\w./*-]*)"
)
DOTTED = re.compile(r"(?<![\w./-])((?:spotd|spotd_[a-z]+)(?:\.[A-Za-z_]\w*)*)(?![\w-])")
FILE_SUFFIXES = {"toml", "db", "json", "service", "yaml", "yml", "log", "py", "md", "j2"}
ENTRY_POINT_GROUPS = {POLICY_GROUP, PROVIDER_GROUP}
# Folders the docs tell users to create, which the repository does not hold.
MADE_BY_USERS = {"deploy/secrets/"}
# A Kubernetes object (`kubectl exec deploy/NAME`) is no path in the repository.
KUBECTL = re.compile(r"kubectl")


def package_dirs() -> dict[str, Path]:
    """Where each top-level package (and the data package) lives in the checkout."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mapped = pyproject["tool"]["setuptools"]["package-dir"]
    return {"spotd": ROOT / "spotd", **{name: ROOT / d for name, d in mapped.items()}}


PACKAGES = package_dirs()


def defines(source: Path, name: str) -> bool:
    """Whether the module file ``source`` defines or imports ``name``."""
    return bool(re.search(rf"\b{re.escape(name)}\b", source.read_text(encoding="utf-8")))


def module_file(folder: Path) -> Path:
    return folder / "__init__.py" if folder.is_dir() else folder


def dotted_exists(name: str) -> bool:
    """A dotted module name, or a module's name followed by names it defines."""
    parts = name.split(".")
    if name in ENTRY_POINT_GROUPS or parts[-1] in FILE_SUFFIXES:
        return True
    for known in sorted(PACKAGES, key=len, reverse=True):
        if name == known or name.startswith(known + "."):
            where, rest = PACKAGES[known], name[len(known) :].lstrip(".").split(".")
            break
    else:
        return False
    rest = [r for r in rest if r]
    while rest and ((where / rest[0]).is_dir() or (where / f"{rest[0]}.py").is_file()):
        where = where / rest[0] if (where / rest[0]).is_dir() else where / f"{rest[0]}.py"
        rest.pop(0)
    if not rest:
        return where.exists()
    source = module_file(where)
    return source.is_file() and defines(source, rest[0])


def path_exists(name: str) -> bool:
    name = name.rstrip(".,:;")
    return bool(list(ROOT.glob(name.rstrip("/")))) if "*" in name else (ROOT / name).exists()


@pytest.mark.parametrize("path", pages(), ids=page_id)
def test_named_paths_exist(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    missing = [
        f
        for f in findings(path, REPO_PATH, text)
        if f.found not in MADE_BY_USERS
        and not KUBECTL.search(" ".join(lines[max(f.line - 2, 0) : f.line]))
        and not path_exists(f.found)
    ]
    assert not missing, "paths that are not in the repository:\n" + "\n".join(map(str, missing))


@pytest.mark.parametrize("path", pages(), ids=page_id)
def test_named_modules_exist(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    missing = [f for f in findings(path, DOTTED, text) if not dotted_exists(f.found)]
    assert not missing, "modules that do not exist:\n" + "\n".join(map(str, missing))


def test_module_names_are_resolved() -> None:
    assert dotted_exists("spotd.market.cache")
    assert dotted_exists("spotd.mail.EmailSettings")
    assert dotted_exists("spotd_aws.notice")
    assert dotted_exists("spotd.examples")
    assert not dotted_exists("spotd.engine.nowhere")
    assert not dotted_exists("spotd.market.cache.NoSuchThing")
    assert path_exists("spotd/mail/webhook*.py")
    assert not path_exists("spotd/engine/nowhere.py")


def layout_block() -> str:
    text = ARCHITECTURE_DOC.read_text(encoding="utf-8")
    section = text.split("## Folder layout", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.DOTALL)
    assert block is not None, "docs/architecture.md's folder layout has no text block"
    return block.group(1)


# Where a layout line's description starts; names are left of it.
DESCRIPTION_COLUMN = 24
FILE_IN_DESCRIPTION = re.compile(r"(?<![\w./*-])([\w*-]+(?:/[\w*.-]+)*\.(?:py|j2)|[\w-]+/)(?![\w])")


def layout_entries(block: str) -> Iterator[tuple[list[Path], str]]:
    """Each entry of the layout tree: its paths (one line may name several) and the
    description beside it, continuation lines included."""
    parents: dict[int, Path] = {-1: ROOT}
    paths: list[Path] = []
    description = ""
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if indent >= DESCRIPTION_COLUMN:
            description += " " + line.strip()
            continue
        if paths:
            yield paths, description
        names, _, description = line.strip().partition("  ")
        depth = indent // 2
        parent = parents[max(d for d in parents if d < depth)]
        parents = {d: p for d, p in parents.items() if d < depth}
        paths = [parent / n.strip() for n in names.split(",") if n.strip() not in ("", "...")]
        if len(paths) == 1 and names.strip().endswith("/"):
            parents[depth] = paths[0]
    if paths:
        yield paths, description


def test_layout_tree_names_real_files() -> None:
    missing = []
    for paths, description in layout_entries(layout_block()):
        missing += [p.relative_to(ROOT).as_posix() for p in paths if not p.exists()]
        base = paths[0] if paths[0].is_dir() else paths[0].parent
        for name in FILE_IN_DESCRIPTION.findall(description):
            places = (base, base.parent, ROOT)
            if not any(list(place.glob(name.rstrip("/"))) for place in places):
                missing.append(f"{name} (in the description of {paths[0].name})")
    assert not missing, f"docs/architecture.md's layout names what does not exist: {missing}"


def test_layout_tree_covers_every_module() -> None:
    named = {p for paths, _ in layout_entries(layout_block()) for p in paths}
    text = layout_block()
    loose = [
        f.relative_to(ROOT).as_posix()
        for f in sorted((ROOT / "spotd").glob("*.py"))
        if f.name not in ("__init__.py", "__main__.py") and f not in named and f.name not in text
    ]
    assert not loose, f"docs/architecture.md's layout leaves out {loose}"


# --- settings ---------------------------------------------------------------------------

PLACEHOLDER = re.compile(r"<[^>]+>")
ROW_KEY = re.compile(r"^\| `([a-z_][\w.<> -]*)` \|", re.MULTILINE)


@dataclass(frozen=True)
class Setting:
    """One key of the settings models: its dotted name and its field."""

    name: str
    default: object
    nested: type[BaseModel] | None
    items: type[BaseModel] | None
    """The model of a list's items, whose keys the row must name."""


def model_of(annotation: object) -> type[BaseModel] | None:
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def settings_keys(model: type[BaseModel], prefix: str = "") -> Iterator[Setting]:
    """Every key of ``model``: nested models, and models in tables of names
    (``[teams.<name>]``), walked; a list of models is one key."""
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        annotation = field.annotation
        args = typing.get_args(annotation)
        origin = typing.get_origin(annotation)
        nested = model_of(annotation)
        items = model_of(args[0]) if origin in (list, tuple) and args else None
        default = field.default if field.default is not PydanticUndefined else None
        yield Setting(dotted, default, nested, items)
        if nested is not None:
            yield from settings_keys(nested, f"{dotted}.")
        elif origin is dict and model_of(args[1]) is not None:
            yield Setting(f"{dotted}.<name>", None, model_of(args[1]), None)
            yield from settings_keys(typing.cast(type[BaseModel], args[1]), f"{dotted}.<name>.")


def normalised(key: str) -> str:
    return PLACEHOLDER.sub("<name>", key)


def config_rows() -> dict[str, str]:
    """Key (placeholders as ``<name>``) -> its row, for the rows of the settings tables
    of docs/config.md (tables whose columns start ``Setting | Type | Default``)."""
    rows: dict[str, str] = {}
    in_settings_table = False
    for line in without_fences(CONFIG_DOC.read_text(encoding="utf-8")).splitlines():
        if not line.startswith("|"):
            in_settings_table = False
        elif re.match(r"\| setting \| type \| default \|", line, re.IGNORECASE):
            in_settings_table = True
        elif in_settings_table and (match := ROW_KEY.match(line)):
            rows.setdefault(normalised(match.group(1)), line)
    return rows


def table_headings() -> set[str]:
    text = CONFIG_DOC.read_text(encoding="utf-8")
    return {normalised(h) for h in re.findall(r"^#+ `\[([^\]]+)\]`", text, re.MULTILINE)}


SETTINGS = list(settings_keys(Settings))


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_setting_has_a_row_in_config_doc(setting: Setting) -> None:
    rows, headings = config_rows(), table_headings()
    documented = setting.name in rows or (setting.nested is not None and setting.name in headings)
    assert documented, f"docs/config.md has no row for `{setting.name}`"


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.items], ids=lambda s: s.name)
def test_list_of_tables_names_its_keys(setting: Setting) -> None:
    row = config_rows().get(setting.name, "")
    assert setting.items is not None
    missing = [k for k in setting.items.model_fields if f"`{k}`" not in row and k not in row]
    assert not missing, f"the row of `{setting.name}` does not name the keys {missing}"


def test_config_doc_documents_no_other_setting() -> None:
    known = {s.name for s in SETTINGS}
    extra = sorted(set(config_rows()) - known)
    assert not extra, f"docs/config.md documents settings the models do not have: {extra}"


@pytest.mark.parametrize(
    "setting",
    [s for s in SETTINGS if isinstance(s.default, int | float) and not isinstance(s.default, bool)],
    ids=lambda s: s.name,
)
def test_numeric_defaults_match(setting: Setting) -> None:
    row = config_rows().get(setting.name)
    if row is None:
        pytest.fail(f"docs/config.md has no row for `{setting.name}`")
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    number = re.fullmatch(r"`(-?[\d.]+)`", cells[2])
    assert number is not None, f"`{setting.name}`: its default {cells[2]!r} is not a number"
    assert float(number.group(1)) == setting.default, (
        f"`{setting.name}`: docs/config.md says {cells[2]}, the model {setting.default!r}"
    )


def test_settings_walk_reaches_nested_tables() -> None:
    names = {s.name for s in SETTINGS}
    assert {"storage.uri", "secrets.file", "webhooks.<name>.url", "teams.<name>"} <= names
    assert {"email.host", "providers.sim.speed", "providers.aws.regions"} <= names
    assert "providers.gcp.attached_gpus.<name>.count" in names
