"""Shared fixtures: a store on every backend.

``store_url`` / ``store`` give each test a fresh database: a SQLite file in
``tmp_path``, or a new PostgreSQL database that is dropped afterwards. The
PostgreSQL cases are marked ``postgres`` and skip (with the reason) when no
server answers at ``SPOTD_TEST_PG_URL`` (default: local trust auth).
"""

from __future__ import annotations

import os
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


@contextmanager
def _pg_database(admin: Engine | str) -> Iterator[str]:
    """A fresh database on the server, dropped on exit; yields its URL."""
    if isinstance(admin, str):
        pytest.skip(admin)
    name = f"spotd_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def _backend_url(kind: str, folder: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'db' / 'spotd.db'}"
        return
    with _pg_database(request.getfixturevalue("pg_admin")) as url:
        yield url


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a fresh PostgreSQL database (skipped, with the reason, without a server)."""
    with _backend_url("postgres", tmp_path, request) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty database on each backend, not yet migrated."""
    with _backend_url(request.param, tmp_path, request) as url:
        yield url


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    """A migrated store on a fresh database of each backend."""
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
