"""Shared fixtures: a store on every backend.

The schema is migrated once per test session into a template, and every test
gets a database of its own made from it: a copy of a SQLite file in
``tmp_path``, or a PostgreSQL database created from a template database
(``CREATE DATABASE ... TEMPLATE``) and dropped afterwards. ``store_url`` /
``store`` give such a migrated database on each backend; ``empty_store_url``
gives one that was never migrated, for the tests of the migrations
themselves.

The templates are safe under pytest-xdist: the SQLite one lives in the
worker's own ``tmp_path_factory`` folder, and the PostgreSQL one is named
after the worker and the session, so no two workers (nor two runs on one
server) share one. The PostgreSQL cases are marked ``postgres`` and skip
(with the reason) when no server answers at ``SPOTD_TEST_PG_URL`` (default:
local trust auth).
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from spotd.store import SqlStore, open_store

PG_ADMIN_URL = os.environ.get(
    "SPOTD_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def _worker() -> str:
    """The pytest-xdist worker running this session (``gw0``, ...), ``main`` without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _pg_url(database: str) -> str:
    return make_url(PG_ADMIN_URL).set(database=database).render_as_string(hide_password=False)


def _migrate(url: str) -> None:
    """Bring the database at ``url`` to the newest revision, as the daemon does."""
    store = open_store(url)
    try:
        if store.engine.dialect.name == "sqlite":
            # Into the main file: a copy of that file alone is then the whole database.
            with store.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        store.close()


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine | str]:
    """An AUTOCOMMIT engine on the PostgreSQL server, or why there is none."""
    engine = create_engine(
        PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
    )
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        engine.dispose()
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        yield f"PostgreSQL not reachable at {PG_ADMIN_URL}: {reason}"
        return
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to the newest revision, once per session (and worker)."""
    path = tmp_path_factory.mktemp("template") / "spotd.db"
    _migrate(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_template(pg_admin: Engine | str) -> Iterator[str]:
    """The name of a PostgreSQL database migrated to the newest revision, once per
    session (and worker), that each test's database is created from."""
    if isinstance(pg_admin, str):
        pytest.skip(pg_admin)
    name = f"spotd_tmpl_{_worker()}_{uuid.uuid4().hex[:8]}"
    with _pg_database(pg_admin, name):
        _migrate(_pg_url(name))
        yield name


@contextmanager
def _pg_database(admin: Engine, name: str, template: str | None = None) -> Iterator[str]:
    """Database ``name`` on the server, empty or a copy of ``template``, dropped on exit;
    yields its URL."""
    # PostgreSQL copies a template only while no one else is connected to it: each
    # worker has its own, and only the session that made it connects to it.
    source = f' TEMPLATE "{template}"' if template else ""
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"{source}'))
    try:
        yield _pg_url(name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def _backend_url(
    kind: str, folder: Path, request: pytest.FixtureRequest, *, migrated: bool = True
) -> Iterator[str]:
    """A database of the test's own on backend ``kind``, migrated from the session's
    template, or never migrated; yields its URL."""
    if kind == "sqlite":
        path = folder / "db" / "spotd.db"
        if migrated:
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    template = request.getfixturevalue("pg_template") if migrated else None
    admin = request.getfixturevalue("pg_admin")
    if isinstance(admin, str):
        pytest.skip(admin)
    with _pg_database(admin, f"spotd_test_{uuid.uuid4().hex[:12]}", template) as url:
        yield url


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a SQLite database of this test's own, migrated to the newest revision."""
    with _backend_url("sqlite", tmp_path, request) as url:
        yield url


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a fresh PostgreSQL database, migrated to the newest revision (skipped,
    with the reason, without a server)."""
    with _backend_url("postgres", tmp_path, request) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a fresh database on each backend, migrated to the newest revision."""
    with _backend_url(request.param, tmp_path, request) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def empty_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty database on each backend, never migrated (the SQLite file and
    its folder do not exist yet)."""
    with _backend_url(request.param, tmp_path, request, migrated=False) as url:
        yield url


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    """A store on a fresh, migrated database of each backend."""
    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture(scope="module", params=BACKENDS)
def module_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SqlStore]:
    """One store per test module and backend, for table-driven tests that
    each create their own jobs and need no empty database."""
    folder = tmp_path_factory.mktemp("module_store")
    with _backend_url(request.param, folder, request) as url:
        opened = open_store(url)
        yield opened
        opened.close()


@pytest.fixture(autouse=True)
def _signals_left_as_found() -> Iterator[None]:
    """A test leaves the worker's SIGINT and SIGTERM handlers as it found them: an
    ignored signal is inherited by every process the worker starts afterwards (a
    ``spotd demo`` that Ctrl-C could not stop)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    after = {s: signal.getsignal(s) for s in before}
    changed = {s.name: (before[s], after[s]) for s in before if after[s] != before[s]}
    for sig, handler in before.items():
        signal.signal(sig, handler)
    assert not changed, f"the test left signal handlers changed: {changed}"
