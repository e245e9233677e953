"""The transition table, checked pair by pair against a real store.

Every (from, to) pair of statuses is tried: pairs in ``TRANSITIONS`` must
apply, all others must raise :class:`IllegalTransition` and change nothing.
"""

from __future__ import annotations

import itertools
from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotd.core.errors import IllegalTransition
from spotd.core.spec import JobSpec
from spotd.core.spec_io import parse_job_toml
from spotd.core.states import TRANSITIONS, FailureCause, JobStatus, Transition, allowed, transition
from spotd.core.values import EventCause
from spotd.store import SqlStore

S = JobStatus
T0 = datetime(2025, 3, 1, tzinfo=UTC)
SPEC_TOML = 'name = "t"\ncommand = ["true"]\n[resources]\ngpus = ["H100"]\ngpus_per_node = 1\n'


@pytest.fixture(scope="module")
def spec() -> JobSpec:
    return parse_job_toml(SPEC_TOML, source="t.toml", base_dir=Path("."))


def path_to(target: JobStatus) -> list[JobStatus]:
    """The shortest chain of legal statuses from PENDING to ``target`` (BFS)."""
    previous: dict[JobStatus, JobStatus | None] = {S.PENDING: None}
    queue = deque([S.PENDING])
    while queue:
        status = queue.popleft()
        for nxt in sorted(TRANSITIONS[status]):
            if nxt not in previous:
                previous[nxt] = status
                queue.append(nxt)
    if target not in previous:
        raise AssertionError(f"{target} cannot be reached from PENDING")
    chain: list[JobStatus] = []
    step: JobStatus | None = target
    while step is not None:
        chain.append(step)
        step = previous[step]
    return chain[::-1]


def legal(job_id: str, expected: JobStatus, new: JobStatus) -> Transition:
    failure = FailureCause.PROVIDER_ERROR if new is S.FAILED else None
    # Any cause will do: the table checks statuses. A real one, since causes read back typed.
    return Transition(job_id, expected, new, cause=EventCause.PLACED, failure=failure)


def job_in(store: SqlStore, spec: JobSpec, status: JobStatus) -> str:
    """A new job, driven into ``status`` through legal transitions."""
    job = store.create_job(spec, now=T0)
    chain = path_to(status)
    for i, (a, b) in enumerate(itertools.pairwise(chain), start=1):
        transition(store, legal(job.id, a, b), now=T0 + timedelta(seconds=i))
    assert store.get_job(job.id).status is status
    return job.id


def test_every_status_is_reachable() -> None:
    for status in S:
        chain = path_to(status)
        assert chain[0] is S.PENDING and chain[-1] is status
        assert all(allowed(a, b) for a, b in itertools.pairwise(chain))


def test_ended_statuses_allow_a_retry_only() -> None:
    for status in S:
        if not status.terminal:
            assert TRANSITIONS[status], status
    assert TRANSITIONS[S.SUCCEEDED] == frozenset()
    assert TRANSITIONS[S.FAILED] == TRANSITIONS[S.CANCELLED] == frozenset({S.RECOVERING})


PAIRS = [
    pytest.param(a, b, id=f"{a}->{b}{'' if allowed(a, b) else '-illegal'}")
    for a, b in itertools.product(S, S)
]


@pytest.mark.parametrize(("from_status", "to_status"), PAIRS)
def test_pair(
    module_store: SqlStore, spec: JobSpec, from_status: JobStatus, to_status: JobStatus
) -> None:
    job_id = job_in(module_store, spec, from_status)
    before_job = module_store.get_job(job_id)
    before_events = module_store.events(job_id)
    now = T0 + timedelta(hours=1)

    if not allowed(from_status, to_status):
        with pytest.raises(IllegalTransition, match=job_id):
            transition(module_store, legal(job_id, from_status, to_status), now=now)
        assert module_store.get_job(job_id) == before_job
        assert module_store.events(job_id) == before_events
        return

    after = transition(module_store, legal(job_id, from_status, to_status), now=now)
    assert (after.status, after.updated_at) == (to_status, now)
    assert after.failure == (FailureCause.PROVIDER_ERROR if to_status is S.FAILED else None)
    assert module_store.get_job(job_id) == after
    events = module_store.events(job_id)
    assert events[:-1] == before_events
    assert (events[-1].from_status, events[-1].to_status, events[-1].at) == (
        from_status,
        to_status,
        now,
    )


@pytest.mark.parametrize("from_status", [s for s in S if allowed(s, S.FAILED)])
def test_failed_needs_a_cause(module_store: SqlStore, spec: JobSpec, from_status: S) -> None:
    job_id = job_in(module_store, spec, from_status)
    events = module_store.events(job_id)
    bare = Transition(job_id, from_status, S.FAILED, cause="boom")
    with pytest.raises(IllegalTransition, match="failure cause"):
        transition(module_store, bare, now=T0 + timedelta(hours=1))
    assert module_store.get_job(job_id).status is from_status
    assert module_store.events(job_id) == events


@pytest.mark.parametrize(
    ("from_status", "to_status"),
    [(a, b) for a, b in itertools.product(S, S) if allowed(a, b) and b is not S.FAILED],
)
def test_only_failed_has_a_cause(
    module_store: SqlStore, spec: JobSpec, from_status: S, to_status: S
) -> None:
    job_id = job_in(module_store, spec, from_status)
    before = module_store.get_job(job_id).failure  # a failed job's own, for a retry
    change = Transition(job_id, from_status, to_status, cause="x", failure=FailureCause.OVER_BUDGET)
    with pytest.raises(IllegalTransition, match="failure cause"):
        transition(module_store, change, now=T0 + timedelta(hours=1))
    assert module_store.get_job(job_id).status is from_status
    assert module_store.get_job(job_id).failure is before
