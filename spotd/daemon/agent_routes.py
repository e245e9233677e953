"""The daemon's agent routes: authenticate an agent's report, parse it, hand it on.

Routes (all ``POST``, JSON body, ``Authorization: Bearer <agent token>``; the
models and the token are :mod:`spotd.core.agent_wire`'s): ``204`` on success (``join``:
``200`` with the roster or ``202`` while the gang is incomplete), ``401`` on a
missing or wrong token or an unknown attempt, ``422`` on a malformed body; each
error as a problem (:mod:`spotd.daemon.problems`). What
the daemon does with a report is up to the :class:`~spotd.core.agent_wire.AgentReports`
it is given.

The token is checked first, before the report is parsed (:mod:`spotd.daemon.guard`):
a caller without it gets 401 whatever it sent, never a 422 that says how a report
looks. An agent's token is its attempt's, so the check reads the attempt the body
names (``job_id`` and ``attempt``, loosely, from the raw JSON); a body that names
none cannot be checked against any token, and gets 401 too.

``log`` (a :class:`~spotd.core.agent_wire.LogChunk` of the node's output) answers
``200`` with a :class:`~spotd.core.agent_wire.LogAck`, or ``409`` for a chunk past
the end of what the daemon holds: a problem with the offset it expects, as
``expected``, from which the agent sends again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from spotd.core.agent_wire import (
    EXIT_PATH,
    HEARTBEAT_PATH,
    JOIN_PATH,
    LOG_PATH,
    NOTICE_PATH,
    PREFLIGHT_PATH,
    SECRETS_PATH,
    AgentLogs,
    AgentReports,
    ExitReport,
    HeartbeatReport,
    JoinReport,
    LogAck,
    LogChunk,
    LogGap,
    NoticeReport,
    PreflightReport,
    Roster,
    Secrets,
    SecretsAsk,
    Waiting,
    agent_token,
)
from spotd.core.orders import ORDERS_PATH, AgentOrders, Orders, OrdersAsk
from spotd.core.rejoin import REJOIN_PATH, AgentRejoin, RejoinAnswer, RejoinAsk
from spotd.daemon.guard import Check, bearer_token, checked_first, same_token, unauthorized
from spotd.daemon.problems import PROBLEM_MEDIA_TYPE, problem_of

AttemptTokenOf = Callable[[str, int], str | None]
"""The client token an attempt was launched with, by job id and attempt; None: no such."""


def claimed_attempt(body: bytes) -> tuple[str, int] | None:
    """The job id and attempt a report's raw JSON names, or None when it names none.

    Read with the same JSON parser and types as the report model will read them
    (a string and an integer), so the attempt checked is the one the route acts for.
    """
    try:
        report: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(report, dict):
        return None
    job_id, attempt = report.get("job_id"), report.get("attempt")
    # type() and not isinstance(): JSON's true is a bool, and a bool is an int.
    if type(job_id) is not str or type(attempt) is not int:
        return None
    return job_id, attempt


def agent_check(daemon_token: str, attempt_token_of: AttemptTokenOf) -> Check:
    """The check of an agent's token against the attempt its report names: 401 unless
    the token is that attempt's."""

    async def check(request: Request) -> None:
        given = bearer_token(request)
        client_token = None
        if given is not None:  # without a token, nothing of the request is read
            claimed = claimed_attempt(await request.body())
            if claimed is not None:
                # Off the event loop: a store read, as the routes' own.
                client_token = await run_in_threadpool(attempt_token_of, *claimed)
        # One answer for "unknown attempt" and "wrong token": a caller learns
        # nothing about which attempts exist.
        if given is None or client_token is None:
            raise unauthorized("missing bearer token or unknown attempt")
        if not same_token(given, agent_token(daemon_token, client_token)):
            raise unauthorized("wrong agent token for this attempt")

    return check


def create_agent_router(
    daemon_token: str,
    reports: AgentReports,
    attempt_token_of: AttemptTokenOf,
    logs: AgentLogs | None = None,
    orders: AgentOrders | None = None,
    *,
    rejoin: AgentRejoin | None = None,
) -> APIRouter:
    """The agent routes, delivering to ``reports``, and the nodes' output to ``logs``
    (without it, no ``log`` route: an agent's chunks get 404 and it stops shipping),
    and answers a node's ask for its orders from ``orders`` (:mod:`spotd.core.orders`;
    without it, 404, which an agent takes as no orders), and tells a gang node standing
    by after its command what next from ``rejoin`` (:mod:`spotd.core.rejoin`; without
    it, 404, on which the agent leaves).

    ``attempt_token_of(job_id, attempt)`` returns the client token the attempt
    was launched with, or None when no such attempt exists.
    """
    router = APIRouter(
        tags=["agent"], route_class=checked_first(agent_check(daemon_token, attempt_token_of))
    )

    @router.post(HEARTBEAT_PATH, status_code=204)
    def heartbeat(report: HeartbeatReport) -> None:
        reports.heartbeat(report)

    @router.post(JOIN_PATH, response_model=Roster | Waiting)
    def join(report: JoinReport, response: Response) -> Roster | Waiting:
        answer = reports.join(report)
        if isinstance(answer, Waiting):
            response.status_code = 202
        return answer

    @router.post(PREFLIGHT_PATH, status_code=204)
    def preflight(report: PreflightReport) -> None:
        reports.preflight(report)

    @router.post(NOTICE_PATH, status_code=204)
    def notice(report: NoticeReport) -> None:
        reports.notice(report)

    @router.post(SECRETS_PATH, response_model=Secrets)
    def secrets(ask: SecretsAsk) -> Secrets:
        return reports.secrets(ask)

    @router.post(EXIT_PATH, status_code=204)
    def exited(report: ExitReport) -> None:
        reports.exited(report)

    if orders is not None:
        told = orders

        @router.post(ORDERS_PATH, response_model=Orders)
        def orders_of(ask: OrdersAsk) -> Orders:
            return told.orders(ask)

    if rejoin is not None:
        asked = rejoin

        @router.post(REJOIN_PATH, response_model=RejoinAnswer)
        def next_step(ask: RejoinAsk) -> RejoinAnswer:
            return asked.next_step(ask)

    if logs is not None:
        kept = logs

        @router.post(LOG_PATH, response_model=LogAck)
        def log(chunk: LogChunk) -> LogAck | Response:
            try:
                return LogAck(end=kept.append(chunk))
            except LogGap as gap:
                return gap_answer(gap)

    return router


def gap_answer(gap: LogGap) -> Response:
    """The 409 of a chunk past the end: its problem, and where the daemon's copy ends."""
    problem = problem_of(gap).model_dump(exclude_none=True)
    return JSONResponse({**problem, "expected": gap.expected}, status_code=problem["status"],
                        media_type=PROBLEM_MEDIA_TYPE)  # fmt: skip
