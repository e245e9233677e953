"""The store's schema: the packaged alembic migrations, run up or down on an engine."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, text

from spotd.store.base import WRITE, db_errors

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
"""The alembic script folder, found next to this module so it works from a wheel."""

_PG_MIGRATION_LOCK = 0x5350_4F54_4400
"""Advisory lock key that serialises migrations of daemons sharing a database."""


def alembic_config(connection: Connection | None = None) -> Config:
    """An alembic config for the packaged migrations, bound to ``connection``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_schema(engine: Engine, revision: str = "head") -> None:
    """Migrate the database up to ``revision``; a no-op when it is there already."""
    with db_errors(), engine.execution_options(**{WRITE: True}).begin() as conn:
        _lock_migrations(conn)
        command.upgrade(alembic_config(conn), revision)


def downgrade_schema(engine: Engine, revision: str = "base") -> None:
    """Migrate the database down to ``revision`` (``base`` drops every table)."""
    with db_errors(), engine.execution_options(**{WRITE: True}).begin() as conn:
        _lock_migrations(conn)
        command.downgrade(alembic_config(conn), revision)


def schema_revision(engine: Engine) -> str | None:
    """The revision the database is at, None when it was never migrated."""
    with db_errors(), engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _lock_migrations(conn: Connection) -> None:
    # Two daemons starting at once on one PostgreSQL must not both create tables.
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
