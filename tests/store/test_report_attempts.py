"""An agent's reports are kept per node: a node kept for its job's next attempt (a gang
whose lost node was replaced) starts its row afresh there, and its old attempt's late
reports are dropped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spotd.core.values import InstanceReport
from spotd.store import open_store

T0 = datetime(2026, 6, 1, tzinfo=UTC)


def report(attempt: int, **fields: object) -> InstanceReport:
    return InstanceReport("i-0", "sim-aws", "j-1", attempt, **fields)  # type: ignore[arg-type]


def test_a_report_of_a_later_attempt_starts_the_row_afresh(store_url: str) -> None:
    store = open_store(store_url)
    try:
        store.save_report(report(1, address="10.0.0.1", joined_at=T0, command_at=T0,
                                 gpu_util_sum=90.0, gpu_samples=1))  # fmt: skip
        store.save_report(report(1, exit_code=143, exited_at=T0 + timedelta(minutes=5),
                                 exit_phase="command"))  # fmt: skip
        store.save_report(report(2, address="10.0.0.7", joined_at=T0 + timedelta(minutes=6)))
        (row,) = store.reports("j-1")
        assert row.attempt == 2 and row.address == "10.0.0.7"
        assert row.joined_at == T0 + timedelta(minutes=6)
        assert (row.exit_code, row.exited_at, row.command_at, row.gpu_samples) == (
            None, None, None, None)  # fmt: skip
        # The old attempt's late word changes nothing; the new one's merges as before.
        store.save_report(report(1, heartbeat_at=T0 + timedelta(minutes=7)))
        store.save_report(report(2, gpu_util_sum=50.0, gpu_samples=1))
        store.save_report(report(2, gpu_util_sum=70.0, gpu_samples=1, joined_at=T0))
        (row,) = store.reports("j-1")
        assert row.attempt == 2 and row.heartbeat_at is None
        assert (row.gpu_util_sum, row.gpu_samples) == (120.0, 2)
        assert row.joined_at == T0 + timedelta(minutes=6)  # the first join stays
    finally:
        store.close()
