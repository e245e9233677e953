"""The API's retry and release routes, in process: what they do and what they refuse."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
from engine_support import spec

from spotd.core.states import FailureCause, JobStatus, Transition
from spotd.core.values import AttemptClose, AttemptEnd, EventCause, Market, NewAttempt, Pool
from spotd.daemon.api import create_app
from spotd.daemon.wiring import build_reader
from spotd.engine.reconcile import Engine

TOKEN = "t" * 32


def send(engine: Engine, path: str) -> httpx.Response:
    """A POST through the app in process."""

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(build_reader(engine), TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://spotd") as client:
            return await client.post(path, headers={"Authorization": f"Bearer {TOKEN}"})

    return asyncio.run(go())


def failed_job(engine: Engine, *, held: bool) -> str:
    """A job whose attempt failed it, its node kept for 30 minutes if ``held``."""
    store, now = engine.store, engine.clock.now()
    job = store.create_job(spec(), now=now)
    store.claim_jobs(engine.settings.owner, lease_seconds=60)  # its daemon's, as a run's is
    pool = Pool("fake", "r1", "r1a", "x1.gpu")
    new = NewAttempt(pool=pool, market=Market.SPOT, nodes=1, price_per_node_hour=1.0,
                     resume_from=None)  # fmt: skip
    placed = Transition(job.id, JobStatus.PENDING, JobStatus.PROVISIONING,
                        cause=EventCause.PLACED, open_attempt=new)
    store.compare_and_set(placed, now=now)
    (attempt,) = store.attempts(job.id)
    store.set_attempt_instances(attempt.id, ["i-1"])
    until = now + timedelta(minutes=30) if held else None
    close = AttemptClose(attempt.id, AttemptEnd.USER_FAILED, exit_code=3, held_until=until)
    store.compare_and_set(Transition(job.id, JobStatus.PROVISIONING, JobStatus.FAILED,
                                     cause=AttemptEnd.USER_FAILED,
                                     failure=FailureCause.USER_COMMAND_FAILED,
                                     close_attempt=close), now=now)  # fmt: skip
    return job.id


def test_a_retry_moves_the_ended_job_to_recovering_at_once(engine: Engine) -> None:
    job_id = failed_job(engine, held=False)
    retried = send(engine, f"/v1/jobs/{job_id}/retry")
    assert retried.status_code == 202, retried.text
    body = retried.json()
    assert (body["id"], body["status"], body["failure"]) == (job_id, "recovering", None)
    assert len(body["attempts"]) == 1, "the earlier attempt stays"
    engine.tick()
    assert len(engine.store.attempts(job_id)) == 2, "a pass placed it again"


def test_a_retry_that_cannot_be_is_a_409_with_its_code(engine: Engine) -> None:
    job = engine.store.create_job(spec(), now=engine.clock.now())
    refused = send(engine, f"/v1/jobs/{job.id}/retry")
    assert refused.status_code == 409
    problem = refused.json()
    assert (problem["code"], problem["job_id"]) == ("retry-refused", job.id)
    assert problem["detail"] == (
        f"job {job.id} is pending, not ended: only a failed or cancelled job can be retried"
    )
    assert send(engine, "/v1/jobs/j-nope/retry").status_code == 404


def test_a_release_is_asked_of_a_job_that_keeps_nodes_only(engine: Engine) -> None:
    held = failed_job(engine, held=True)
    view = send(engine, f"/v1/jobs/{held}/release")
    assert view.status_code == 202, view.text
    body = view.json()
    assert [a["kind"] for a in body["asked"]] == ["release"]
    assert body["held"]["instance_ids"] == ["i-1"] and body["held"]["attempt"] == 1
    engine.tick()  # the hold's keeper stops the node
    done = engine.store.attempts(held)[0]
    assert done.held_until is None and done.released_at is not None
    again = send(engine, f"/v1/jobs/{held}/release")
    assert (again.status_code, again.json()["code"]) == (409, "nothing-held")
    bare = failed_job(engine, held=False)
    assert send(engine, f"/v1/jobs/{bare}/release").json()["code"] == "nothing-held"


def test_the_jobs_dashboard_page_shows_the_kept_nodes(engine: Engine) -> None:
    from spotd.core.values import InstanceReport
    from spotd.daemon.dashboard.job_page import job_detail
    from spotd.daemon.dashboard.render import page

    held = failed_job(engine, held=True)
    engine.store.save_report(InstanceReport("i-1", "fake", held, 1, address="10.0.0.7"))
    reader = build_reader(engine)
    detail = job_detail(reader, engine.store.get_job(held))
    html = page("job_body.html.j2", d=detail, clock=None, zone=reader.zone, stamp="1").body
    kept = html.decode().split('id="held"')[1].split("</p>")[0]
    assert "attempt 1's i-1 at 10.0.0.7" in kept and f"spotd release {held}" in kept
    bare = job_detail(reader, engine.store.get_job(failed_job(engine, held=False)))
    other = page("job_body.html.j2", d=bare, clock=None, zone=reader.zone, stamp="1").body
    assert b'id="held"' not in other
