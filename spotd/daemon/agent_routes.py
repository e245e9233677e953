"""The daemon's agent routes: authenticate an agent's report, parse it, hand it on.

Routes (all ``POST``, JSON body, ``Authorization: Bearer <agent token>``; the
models and the token are :mod:`spotd.core.agent_wire`'s): ``204`` on success (``join``:
``200`` with the roster or ``202`` while the gang is incomplete), ``401`` on a
missing or wrong token or an unknown attempt, ``422`` on a malformed body. What
the daemon does with a report is up to the :class:`~spotd.core.agent_wire.AgentReports`
it is given.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from spotd.core.agent_wire import (
    EXIT_PATH,
    HEARTBEAT_PATH,
    JOIN_PATH,
    NOTICE_PATH,
    PREFLIGHT_PATH,
    SECRETS_PATH,
    AgentReport,
    AgentReports,
    ExitReport,
    HeartbeatReport,
    JoinReport,
    NoticeReport,
    PreflightReport,
    Roster,
    Secrets,
    SecretsAsk,
    Waiting,
    agent_token,
)

# Module level: FastAPI resolves the string annotations below in module globals.
_bearer = HTTPBearer(auto_error=False)
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def create_agent_router(
    daemon_token: str,
    reports: AgentReports,
    attempt_token_of: Callable[[str, int], str | None],
) -> APIRouter:
    """The agent routes, delivering to ``reports``.

    ``attempt_token_of(job_id, attempt)`` returns the client token the attempt
    was launched with, or None when no such attempt exists.
    """
    router = APIRouter(tags=["agent"])

    def authorize(creds: HTTPAuthorizationCredentials | None, report: AgentReport) -> None:
        client_token = attempt_token_of(report.job_id, report.attempt)
        # One answer for "unknown attempt" and "wrong token": a caller learns
        # nothing about which attempts exist.
        if creds is None or client_token is None:
            raise HTTPException(status_code=401, detail="missing bearer token or unknown attempt")
        expected = agent_token(daemon_token, client_token)
        if not hmac.compare_digest(creds.credentials.encode(), expected.encode()):
            raise HTTPException(status_code=401, detail="wrong agent token for this attempt")

    @router.post(HEARTBEAT_PATH, status_code=204)
    def heartbeat(report: HeartbeatReport, creds: _Credentials) -> None:
        authorize(creds, report)
        reports.heartbeat(report)

    @router.post(JOIN_PATH, response_model=Roster | Waiting)
    def join(report: JoinReport, creds: _Credentials, response: Response) -> Roster | Waiting:
        authorize(creds, report)
        answer = reports.join(report)
        if isinstance(answer, Waiting):
            response.status_code = 202
        return answer

    @router.post(PREFLIGHT_PATH, status_code=204)
    def preflight(report: PreflightReport, creds: _Credentials) -> None:
        authorize(creds, report)
        reports.preflight(report)

    @router.post(NOTICE_PATH, status_code=204)
    def notice(report: NoticeReport, creds: _Credentials) -> None:
        authorize(creds, report)
        reports.notice(report)

    @router.post(SECRETS_PATH, response_model=Secrets)
    def secrets(ask: SecretsAsk, creds: _Credentials) -> Secrets:
        authorize(creds, ask)
        return reports.secrets(ask)

    @router.post(EXIT_PATH, status_code=204)
    def exited(report: ExitReport, creds: _Credentials) -> None:
        authorize(creds, report)
        reports.exited(report)

    return router
