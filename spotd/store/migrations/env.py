"""Alembic environment for spotd's store.

:func:`spotd.store.schema.upgrade_schema` passes its own connection (already in
a transaction) in ``config.attributes["connection"]``. The alembic command
line (``alembic -c spotd/store/alembic.ini ...``) connects to
``SPOTD_DATABASE_URL``, else to ``sqlalchemy.url`` from the ini file.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, create_engine
from sqlalchemy.pool import NullPool
from sqlmodel import SQLModel

import spotd.store.tables  # noqa: F401  (registers the tables on the metadata)

TARGET_METADATA = SQLModel.metadata


def _url() -> str:
    url = os.environ.get("SPOTD_DATABASE_URL") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("alembic: set SPOTD_DATABASE_URL or sqlalchemy.url")
    return url


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    context.configure(
        connection=connection,
        url=url,
        target_metadata=TARGET_METADATA,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=True,
        compare_type=True,
        literal_binds=connection is None,
    )


def _run(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Emit the migration SQL for ``sqlalchemy.url`` without connecting."""
    _configure(url=_url())
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate over the given connection, or one to ``sqlalchemy.url``."""
    given = context.config.attributes.get("connection")
    if isinstance(given, Connection):
        _run(given)
        return
    engine = create_engine(_url(), poolclass=NullPool)
    with engine.connect() as connection:
        _run(connection)
        connection.commit()


# Only the command line has an ini file; open_store() leaves the app's logging alone.
if context.config.config_file_name is not None:
    fileConfig(context.config.config_file_name, disable_existing_loggers=False)

if context.is_offline_mode():
    run_offline()
else:
    run_online()
