"""The daemon's HTTP API (FastAPI): what the CLI talks to.

Every route but ``/v1/health`` needs ``Authorization: Bearer <token>``, the
token being the content of the daemon's token file (mode 0600). The web
dashboard under ``/dashboard`` (:mod:`spotd.daemon.dashboard`) takes the same
token at its login page and keeps a signed cookie instead.

The token is checked before anything else of a request is read
(:mod:`spotd.daemon.guard`): without it every route answers 401, whatever the
request's body, parameters or headers.

Limits (docs/operations.md, "API limits"): a request body over ``[daemon]
max_body_bytes`` gets 413 unread, one that does not come within ``[daemon]
body_timeout_seconds`` 408 (:mod:`spotd.daemon.limits`); ``GET /v1/jobs``
answers one page of at most :data:`MAX_PAGE` jobs, newest first, with the cursor
of the next; a submit with an ``Idempotency-Key`` its job already holds gets that
job back (200) instead of a second one. A submit body has ``spec`` only, an
unknown field is refused (422); a key or a cursor that cannot be one is
refused (422) and quoted by its start only.

Every error answer is a problem (RFC 9457, :mod:`spotd.daemon.problems`): the
status and code of the error's class, handled in :mod:`spotd.daemon.problem_handlers`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Query, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from spotd import __version__
from spotd.core.agent_wire import Secrets, SecretsAsk
from spotd.core.clock import WALL, clock_note
from spotd.core.contracts import Clock, Store
from spotd.core.errors import BadCursor, IdempotencyKeyReused, StoreError, SubmitRefused
from spotd.core.intents import IntentKind
from spotd.core.spec import JobSpec
from spotd.core.spec_fields import Priority
from spotd.core.states import JobStatus
from spotd.core.values import JobRecord
from spotd.daemon.agent_routes import create_agent_router
from spotd.daemon.dashboard import install_dashboard
from spotd.daemon.guard import checked_first, token_check
from spotd.daemon.joblogs import job_logs
from spotd.daemon.limits import (
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    BodyLimit,
    cursor_problem,
    idempotency_key_problem,
    quoted_start,
)
from spotd.daemon.logview import LogsView, decode_cursor
from spotd.daemon.metrics import Outboxlike, create_metrics_router
from spotd.daemon.orders import DaemonOrders
from spotd.daemon.planning import PlanView, plan_submitted
from spotd.daemon.problem_handlers import install_problem_handlers
from spotd.daemon.problems import field_problems, invalid, invalid_field
from spotd.daemon.reader import Reader
from spotd.daemon.rejoin import DaemonRejoin
from spotd.daemon.secrets import missing_secrets
from spotd.daemon.views import (
    STATUS_WORDS,
    EventView,
    JobPageView,
    JobView,
    MarketView,
    event_view,
    job_view,
    market_view,
    warning_view,
)
from spotd.engine.reports import StoreReports
from spotd.store.joblogs import DEFAULT_KEEP_BYTES, JobLogRows

DEFAULT_PAGE = 100
"""Jobs in one page of ``GET /v1/jobs`` when the request names no ``limit``."""
MAX_PAGE = 1000
"""The most jobs one page holds: a page's views are built in memory at once."""


class SubmitBody(BaseModel):
    """A job spec, already parsed from TOML by the client; nothing else, as in the
    spec itself: a field this daemon does not know is refused, not dropped."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any]


class PriorityBody(BaseModel):
    """The priority a job should have (the bounds of the spec's ``priority``)."""

    model_config = ConfigDict(extra="forbid")

    priority: Priority


class DrillBody(BaseModel):
    """Which node of the running job to drill, by its rank (0 when left out)."""

    model_config = ConfigDict(extra="forbid")

    node: int = Field(default=0, ge=0)


class DaemonReports(StoreReports):
    """The agents' reports kept in the store (:class:`~spotd.engine.reports.StoreReports`),
    and the job's secrets they ask for, from the values the daemon holds (``held``)."""

    def __init__(
        self, store: Store, held: Mapping[str, SecretStr] | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(store, clock)
        self._held = dict(held or {})

    def secrets(self, ask: SecretsAsk) -> Secrets:
        """The values of the secrets the node's job names, as far as the daemon holds them."""
        names = self._store.get_job(ask.job_id).spec.secrets
        values = {n: self._held[n].get_secret_value() for n in names if n in self._held}
        return Secrets(values=values, missing=tuple(missing_secrets(names, self._held)))


def create_app(
    reader: Reader,
    token: str,
    *,
    outbox: Outboxlike | None = None,
    secrets: Mapping[str, SecretStr] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS,
    wall: Clock = WALL,
    log_keep_bytes: int = DEFAULT_KEEP_BYTES,
) -> FastAPI:
    """The API over what ``reader`` reads, guarded by ``token``; agents use their own tokens.

    ``secrets`` are the values the daemon holds for jobs (``[secrets]``): a job
    naming one it lacks is refused at submit, and agents get their job's own.
    A request body over ``max_body_bytes`` (``[daemon] max_body_bytes``) gets 413,
    one not all there within ``body_timeout_seconds`` (``[daemon]
    body_timeout_seconds``) 408. ``wall`` is the real clock (how old the prices are,
    the dashboard's sessions), which the daemon's, on a simulated market, is not.
    The nodes' output the agents ship is kept in the store, the newest
    ``log_keep_bytes`` of each job (``[agent] log_keep_bytes``).
    """
    app = FastAPI(title="spotd", version=__version__)
    install_problem_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, timeout_seconds=body_timeout_seconds)

    def attempt_token_of(job_id: str, seq: int) -> str | None:
        try:
            attempts = reader.store.attempts(job_id)
        except StoreError:
            return None
        return next((a.client_token for a in attempts if a.seq == seq), None)

    held = dict(secrets or {})
    reports = DaemonReports(reader.store, held, reader.clock)  # the engine's clock
    kept_logs = JobLogRows.of(reader.store, keep_bytes=log_keep_bytes)
    orders = DaemonOrders(reader.store, reader.clock)
    rejoin = DaemonRejoin(reader.store, token)
    app.include_router(create_agent_router(token, reports, attempt_token_of, kept_logs, orders,
                                           rejoin=rejoin))  # fmt: skip

    guarded = checked_first(token_check(token))
    # Spend figures are not for anyone on the host: Prometheus sends the
    # token too (``authorization: credentials_file`` in its scrape config).
    app.include_router(create_metrics_router(reader, outbox=outbox, route_class=guarded))

    @app.get("/v1/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    app.include_router(create_jobs_router(reader, route_class=guarded, secrets=held, wall=wall))
    install_dashboard(app, reader, token, wall)
    return app


def create_jobs_router(
    reader: Reader,
    *,
    dependencies: Sequence[Any] = (),
    route_class: type[APIRoute] = APIRoute,
    secrets: Mapping[str, SecretStr] | None = None,
    wall: Clock = WALL,
) -> APIRouter:
    """The job routes (submit, list, show, events, plan, cancel, retry, release, drill,
    priority, logs) and the prices (their ages by ``wall``), each guarded by ``route_class``
    (:func:`~spotd.daemon.guard.checked_first`) and ``dependencies``.

    Every answer is read from the store; a cancel, a release or a priority is an intent
    stored for the loop of the daemon that holds the job (202: asked, not done yet). A
    retry moves the ended job to recovering itself (:mod:`spotd.engine.retrying` says
    why), and a daemon's next pass places it (202 too)."""
    router = APIRouter(dependencies=list(dependencies), route_class=route_class)
    clock = clock_note(reader.clock)

    def view(ref: str) -> JobView:
        return reader.view(reader.store.find_job(ref))

    @router.post("/v1/jobs", status_code=201)
    def submit(
        body: SubmitBody,
        response: Response,
        # Checked here, not by Header(max_length=...): FastAPI's 422 quotes a value whole.
        idempotency_key: Annotated[str | None, Header()] = None,
    ) -> JobView:
        if idempotency_key is not None:
            _refuse_if(idempotency_key_problem(idempotency_key))
        try:
            spec = JobSpec.model_validate(body.spec)
        except ValidationError as exc:
            problems = field_problems(exc.errors(include_url=False), within=("spec",))
            raise invalid(problems) from exc
        if idempotency_key is not None:
            earlier = reader.store.job_by_idempotency_key(idempotency_key)
            if earlier is not None:
                response.status_code = 200
                return _repeated(reader, earlier, spec, idempotency_key)
        missing = missing_secrets(spec.secrets, secrets or {})
        if missing:
            raise SubmitRefused(
                f"secrets: this daemon holds no value for {', '.join(missing)}; add it to "
                "the daemon's [secrets] file or a SPOTD_SECRET_<NAME> variable (docs/config.md)",
                field="secrets",
            )
        job = reader.submit(spec, idempotency_key=idempotency_key)
        if job.spec != spec:  # a racing submit of the same key stored another spec first
            return _repeated(reader, job, spec, idempotency_key)
        view = job_view(job, reader.store.attempts(job.id), reader.clock.now(), zone=reader.zone,
                        clock=clock)  # fmt: skip
        warnings = [warning_view(w) for w in reader.submit_warnings(spec)]
        return view.model_copy(update={"warnings": warnings}) if warnings else view

    @router.get("/v1/prices")
    def prices() -> MarketView:
        return market_view(reader.market.snapshots(), wall.now().timestamp())

    @router.get("/v1/jobs")
    def jobs(
        status: Annotated[list[str] | None, Query()] = None,
        team: str | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
        cursor: str | None = None,
    ) -> JobPageView:
        """One page of jobs, newest first; ``status`` (repeatable): a status, ``active``
        or ``ended``; ``team``: the spec's; ``cursor``: the ``next`` of the page before."""
        if cursor is not None:
            _check_cursor(cursor)
        return _job_page(reader, _statuses(status), team, limit, cursor)

    @router.get("/v1/jobs/{ref}")
    def job(ref: str) -> JobView:
        return view(ref)

    @router.get("/v1/jobs/{ref}/events")
    def events(ref: str) -> list[EventView]:
        job = reader.store.find_job(ref)
        return [event_view(e, clock) for e in reader.store.events(job.id)]

    @router.get("/v1/jobs/{ref}/plan")
    def plan(ref: str, policy: str | None = None) -> PlanView:
        # The loop's context: the job's cooldowns, current placement and progress.
        return plan_submitted(reader.planner, reader.store.find_job(ref), policy)

    @router.post("/v1/jobs/{ref}/cancel", status_code=202)
    def cancel(ref: str) -> JobView:
        """Ask for the job to be cancelled; its daemon's next pass stops it."""
        job = reader.store.find_job(ref)
        reader.ask(job, IntentKind.CANCEL)
        return view(job.id)

    _add_retry_routes(router, reader)
    _add_drill_route(router, reader)

    @router.post("/v1/jobs/{ref}/priority", status_code=202)
    def priority(ref: str, body: PriorityBody) -> JobView:
        """Ask for another priority; its daemon's next pass gives it."""
        job = reader.store.find_job(ref)
        reader.ask(job, IntentKind.PRIORITY, priority=body.priority)
        return view(job.id)

    @router.get("/v1/jobs/{ref}/logs")
    def logs(
        ref: str,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        node: Annotated[int | None, Query(ge=0)] = None,
        after: str | None = None,
    ) -> LogsView:
        """Each node's output, oldest attempt first (of one ``attempt`` and one ``node``
        rank, if given); ``after``: the ``cursor`` of an earlier answer, for only what
        came since."""
        try:
            offsets = decode_cursor(after or "")
        except ValueError as exc:
            raise invalid_field("after", f"after: {exc}; pass back the `cursor` of an "
                                "answer as it came") from exc  # fmt: skip
        job = reader.store.find_job(ref)
        return job_logs(reader, job, attempt=attempt, node=node, after=offsets)

    return router


def _add_retry_routes(router: APIRouter, reader: Reader) -> None:
    """The routes on a job that failed or was cancelled: retry it, release its kept nodes."""

    @router.post("/v1/jobs/{ref}/retry", status_code=202)
    def retry(ref: str) -> JobView:
        """Retry a failed or cancelled job under its id; a daemon's next pass places it, to
        resume from its last complete checkpoint."""
        job = reader.retry(reader.store.find_job(ref))
        return reader.view(job)

    @router.post("/v1/jobs/{ref}/release", status_code=202)
    def release(ref: str) -> JobView:
        """Ask for the nodes a failed job keeps (``keep_on_failure``) to be stopped now."""
        job = reader.store.find_job(ref)
        reader.ask(job, IntentKind.RELEASE)
        return reader.view(job)


def _add_drill_route(router: APIRouter, reader: Reader) -> None:
    """The route that asks for a drill of a running job (:mod:`spotd.engine.drills`)."""

    @router.post("/v1/jobs/{ref}/drill", status_code=202)
    def drill(ref: str, body: DrillBody | None = None) -> JobView:
        """Ask for a drill: its daemon's next pass has the provider preempt the node with
        its own notice. 409 ``drill-refused`` for a job that cannot have one now."""
        job = reader.store.find_job(ref)
        reader.drill(job, (body or DrillBody()).node)
        return reader.view(reader.store.get_job(job.id))


def _job_page(
    reader: Reader,
    statuses: frozenset[JobStatus] | None,
    team: str | None,
    limit: int,
    cursor: str | None,
) -> JobPageView:
    try:
        page = reader.store.jobs_page(statuses=statuses, team=team, limit=limit, cursor=cursor)
    except BadCursor as exc:
        raise BadCursor(_cursor_detail(cursor or "", "not one this daemon made")) from exc
    # One read of the page's attempts and one of its ledger lines, not two per job:
    # per-job reads were most of the 16 s `spotd status` took with 320 active jobs.
    ids = [j.id for j in page.jobs]
    attempts = reader.store.attempts_for(ids)
    ledger = reader.store.ledger_for(ids)
    now = reader.clock.now()
    clock = clock_note(reader.clock)
    views = [job_view(j, attempts[j.id], now, ledger=ledger[j.id], zone=reader.zone, clock=clock)
             for j in page.jobs]  # fmt: skip
    return JobPageView(jobs=views, next=page.next)


def _refuse_if(problem: str | None) -> None:
    """A 422 for the ``Idempotency-Key`` header that says ``problem``, if there is one."""
    if problem is not None:
        raise invalid_field("Idempotency-Key", problem)


def _check_cursor(cursor: str) -> None:
    """422 for a cursor that by its look is none (too long, characters none has)."""
    problem = cursor_problem(cursor)
    if problem is not None:
        raise BadCursor(_cursor_detail(cursor, problem))


def _cursor_detail(cursor: str, problem: str) -> str:
    return (
        f"cursor: {quoted_start(cursor)} is not a job listing cursor ({problem}); "
        "pass back the `next` of a page as it came"
    )


def _repeated(reader: Reader, job: JobRecord, spec: JobSpec, key: str | None) -> JobView:
    """The job an earlier submit of ``key`` stored; 409 when it was another spec."""
    if job.spec != spec:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was used for job {job.id} ({job.name}) with "
            "another spec; a new submit needs a new key",
            job_id=job.id,
        )
    return reader.view(job)


def _statuses(words: Sequence[str] | None) -> frozenset[JobStatus] | None:
    """The statuses ``status=`` names (None: every job); 422 for a word of none."""
    if not words:
        return None
    unknown = [w for w in words if w not in STATUS_WORDS]
    if unknown:
        raise invalid_field("status", (
            f"status: {', '.join(map(repr, unknown))} is not one of {', '.join(STATUS_WORDS)}"
        ))  # fmt: skip
    return frozenset().union(*(STATUS_WORDS[w] for w in words))
