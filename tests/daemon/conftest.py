"""Fixtures of the daemon's in-process API tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import FakeProvider

from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy
from spotd_sim import SimClock


@pytest.fixture
def engine(tmp_path: Path, sqlite_url: str) -> Iterator[Engine]:
    """An engine on a fresh SQLite store and a scripted provider, for an app in process."""
    store = open_store(sqlite_url)
    yield Engine(
        store, {"fake": FakeProvider()}, CheapestPolicy(), SimClock(tmp_path / "c", 3600.0),
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"),
    )  # fmt: skip
    store.close()
