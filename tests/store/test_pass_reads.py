"""What a reconcile pass reads of the store: its jobs' versions under one lease per
owner, the jobs by id, and the feed of agent reports written since the last read."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus, Transition
from spotd.core.values import EventCause, InstanceReport
from spotd.store import SqlStore
from spotd.store.leases import HELD_BY_OWNER

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def spec(name: str = "t") -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "command": ["true"], "resources": {"gpus": ["A100"], "gpus_per_node": 1}}
    )


def test_a_renewal_writes_the_owners_row_not_every_job(store: SqlStore) -> None:
    jobs = [store.create_job(spec(f"j{i}"), now=T0) for i in range(3)]
    versions = store.claim_job_versions("d1", now=at(0), lease_seconds=60)
    assert versions == {j.id: 0 for j in jobs}
    with store.engine.connect() as conn:
        stored = conn.execute(text("SELECT DISTINCT lease_until FROM jobs")).scalars().all()
    assert len(stored) == 1, "every job carries the one marker, not a time of its own"
    # Renewed: one row moves, and every job's lease (as read) with it.
    store.claim_job_versions("d1", now=at(0.9), lease_seconds=60)
    assert {store.get_job(j.id).lease_until for j in jobs} == {at(1.9)}
    assert store.claim_job_versions("d2", now=at(1.5), lease_seconds=60) == {}
    assert set(store.claim_job_versions("d2", now=at(2), lease_seconds=60)) == {j.id for j in jobs}


def test_a_claim_takes_its_share_of_the_free_jobs(store: SqlStore) -> None:
    for peer in ("d2", "d3"):  # just started: announced, not passed yet
        store.renew_lease(peer, lease_seconds=3600)
    jobs = [store.create_job(spec(f"j{i}"), now=T0) for i in range(7)]
    first = store.claim_job_versions("d1", now=at(0), lease_seconds=60, share_of=3)
    assert len(first) == 3  # 7 active among 3 daemons: ceil(7 / 3)
    # A quick daemon passing again takes no more: its share is of the active jobs, not
    # of what is still free (which would hand it ceil(4 / 3) more on every pass).
    again = store.claim_job_versions("d1", now=at(0.1), lease_seconds=60, share_of=3)
    assert again == first
    second = store.claim_job_versions("d2", now=at(0.2), lease_seconds=60, share_of=3)
    assert len(second) == 3 and not set(first) & set(second)
    third = store.claim_job_versions("d3", now=at(0.3), lease_seconds=60, share_of=3)
    assert len(third) == 1
    assert set(first) | set(second) | set(third) == {j.id for j in jobs}


def test_a_daemon_that_stops_passing_loses_its_share(store: SqlStore) -> None:
    """Counted alive by its lock (``share_of`` 3) but no longer renewing: its jobs are
    free once its lease runs out, and the daemons still passing share them out."""
    for peer in ("d1", "d2", "d3"):
        store.claim_job_versions(peer, now=at(0), lease_seconds=60, share_of=3)
    jobs = [store.create_job(spec(f"j{i}"), now=T0) for i in range(6)]
    held = {
        peer: store.claim_job_versions(peer, now=at(0.5), lease_seconds=60, share_of=3)
        for peer in ("d1", "d2", "d3")
    }
    assert [len(h) for h in held.values()] == [2, 2, 2]
    # d3 stops passing; d1 and d2 go on renewing (until 2.2 min) and, once d3's lease
    # ran out (1.5 min), take its two jobs, one each.
    for peer in ("d1", "d2"):
        assert held[peer] == store.claim_job_versions(
            peer, now=at(1.2), lease_seconds=60, share_of=3
        )
    d1 = store.claim_job_versions("d1", now=at(1.6), lease_seconds=60, share_of=3)
    d2 = store.claim_job_versions("d2", now=at(1.6), lease_seconds=60, share_of=3)
    assert len(d1) == len(d2) == 3
    assert set(d1) | set(d2) == {j.id for j in jobs}
    # Alone (share_of 1), a daemon takes every free job.
    extra = [store.create_job(spec(f"k{i}"), now=T0) for i in range(2)]
    alone = store.claim_job_versions("d1", now=at(1.7), lease_seconds=60)
    assert set(d1) | {j.id for j in extra} == set(alone)


def test_versions_count_changes_and_ended_jobs_are_not_held(store: SqlStore) -> None:
    a = store.create_job(spec("a"), now=T0)
    b = store.create_job(spec("b"), now=T0)
    store.claim_job_versions("d1", now=at(0), lease_seconds=60)
    cancel = Transition(a.id, JobStatus.PENDING, JobStatus.CANCELLED, EventCause.CANCELLED)
    store.compare_and_set(cancel, now=at(1))
    assert store.claim_job_versions("d1", now=at(1), lease_seconds=60) == {b.id: 0}
    assert store.job_versions([a.id, b.id, "j-none"]) == {a.id: 1, b.id: 0}
    found = store.jobs_by_id([a.id, "j-none"])
    assert list(found) == [a.id] and found[a.id].status is JobStatus.CANCELLED


def test_a_job_leased_per_job_by_an_older_daemon_is_held_until_its_own_lease_ends(
    store: SqlStore,
) -> None:
    """A daemon from before owner leases renews ``jobs.lease_until`` itself and has no row."""
    job = store.create_job(spec(), now=T0)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET owner = 'old', lease_until = :t WHERE id = :id"),
                     {"t": at(1).replace(tzinfo=None), "id": job.id})  # fmt: skip
    assert store.claim_job_versions("new", now=at(0.5), lease_seconds=60) == {}
    assert store.get_job(job.id).lease_until == at(1)
    assert store.claim_job_versions("new", now=at(1.5), lease_seconds=60) == {job.id: 0}
    # Taken: marked so that an older daemon never takes it back while we hold it.
    with store.engine.connect() as conn:
        raw = conn.execute(text("SELECT lease_until FROM jobs")).scalar_one()
    assert str(raw).startswith(str(HELD_BY_OWNER.year))


def test_an_owner_back_on_a_newer_version_marks_its_jobs_held(store: SqlStore) -> None:
    job = store.create_job(spec(), now=T0)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET owner = 'd1', lease_until = :t WHERE id = :id"),
                     {"t": at(1).replace(tzinfo=None), "id": job.id})  # fmt: skip
    assert store.claim_job_versions("d1", now=at(0.5), lease_seconds=600) == {job.id: 0}
    # Past its old per-job lease, still d1's: its row holds it now.
    assert store.claim_job_versions("d2", now=at(5), lease_seconds=60) == {}


def _report(job_id: str, iid: str, **fields: object) -> InstanceReport:
    return InstanceReport(iid, "aws", job_id, 1, **fields)  # type: ignore[arg-type]


def _exact(store: SqlStore) -> bool:
    """Whether the feed returns nothing twice here. On PostgreSQL its cursor is the
    server's oldest running transaction, which any other session on the server (another
    test's database, another daemon) holds back: reports may come back again, never
    go missing, and only that is checked there."""
    return store.engine.dialect.name == "sqlite"


def test_the_report_feed_returns_what_was_written_since(store: SqlStore) -> None:
    job = store.create_job(spec(), now=T0)
    store.save_report(_report(job.id, "i-0", heartbeat_at=at(0)))
    since = store.report_cursor()
    if _exact(store):
        assert store.report_changes(since) == ([], since), "older reports are not read again"

    store.save_report(_report(job.id, "i-1", address="10.0.0.1"))
    store.save_report(_report(job.id, "i-0", exit_code=3))
    changed, after = store.report_changes(since)
    assert {r.instance_id: r.exit_code for r in changed} == {"i-0": 3, "i-1": None}
    (merged,) = [r for r in changed if r.instance_id == "i-0"]
    assert merged.heartbeat_at == at(0), "a change comes back as the whole merged row"

    store.save_report(replace(_report(job.id, "i-1"), step=5))
    again, _ = store.report_changes(after)
    seen = [(r.instance_id, r.step) for r in again]
    assert seen == [("i-1", 5)] if _exact(store) else ("i-1", 5) in seen


def test_the_report_feed_from_zero_is_every_report(store: SqlStore) -> None:
    job = store.create_job(spec(), now=T0)
    for n in range(3):
        store.save_report(_report(job.id, f"i-{n}"))
    everything, after = store.report_changes(0)
    assert len(everything) == 3
    if _exact(store):
        assert store.report_changes(after)[0] == []
