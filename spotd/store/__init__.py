"""Durable state of spotd: the SQL :class:`~spotd.core.contracts.Store` and its migrations.

Use :func:`open_store` with a ``sqlite:///...`` or ``postgresql+psycopg://...``
URL; it migrates the schema to the newest revision before returning.
"""

from spotd.store.schema import downgrade_schema, schema_revision, upgrade_schema
from spotd.store.sql import SqlStore, client_token, open_store

__all__ = [
    "SqlStore",
    "client_token",
    "downgrade_schema",
    "open_store",
    "schema_revision",
    "upgrade_schema",
]
