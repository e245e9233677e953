"""The daemon's side of the on-VM agent: report models, agent tokens and routes.

An agent speaks for exactly one attempt of one job. Its bearer token is
``agent_token(daemon_token, client_token)``: an HMAC of the attempt's launch
client token keyed with the daemon's own token. The daemon can recompute it for
any attempt it knows, the VM never sees the daemon's token, and a token stolen
from one VM is worthless for any other attempt.

Routes (all ``POST``, JSON body, ``Authorization: Bearer <agent token>``,
answer ``204`` on success, ``401`` on a missing or wrong token or an unknown
attempt, ``422`` on a malformed body):

``/v1/agent/heartbeat``  :class:`AgentReport`
``/v1/agent/notice``     :class:`NoticeReport`
``/v1/agent/exit``       :class:`ExitReport`

What the daemon does with a report is up to the :class:`AgentReports` it is
given; this module only authenticates and parses.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Literal, Protocol

from fastapi import APIRouter, Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict

NoticeKind = Literal["preemption", "rebalance"]

HEARTBEAT_PATH = "/v1/agent/heartbeat"
NOTICE_PATH = "/v1/agent/notice"
EXIT_PATH = "/v1/agent/exit"


def agent_token(daemon_token: str, client_token: str) -> str:
    """The bearer token of the agent of the attempt launched with ``client_token``.

    HMAC-SHA256 keyed with ``daemon_token`` over ``client_token``, as lowercase hex.
    """
    return hmac.new(daemon_token.encode(), client_token.encode(), hashlib.sha256).hexdigest()


class AgentReport(BaseModel):
    """What every report carries: who speaks, from where, and when (aware UTC)."""

    # Agents on VMs may run a newer spotd than the daemon: ignore fields we do not know.
    model_config = ConfigDict(frozen=True, extra="ignore")

    job_id: str
    attempt: int
    instance_id: str
    provider: str
    at: datetime


class NoticeReport(AgentReport):
    """The provider announced it takes the VM back (``preemption``) or may soon (``rebalance``).

    ``deadline`` is when the provider will act, if it said so.
    """

    kind: NoticeKind
    deadline: datetime | None = None
    detail: str = ""


class ExitReport(AgentReport):
    """The job's command ended. ``exit_code`` is 128 + N when signal N killed it."""

    exit_code: int


class AgentReports(Protocol):
    """Where the daemon's agent routes deliver authenticated reports.

    Called from FastAPI's worker threads, so implementations must be thread-safe.
    """

    def heartbeat(self, report: AgentReport) -> None:
        """The agent of ``report.job_id``/``report.attempt`` is alive."""

    def notice(self, report: NoticeReport) -> None:
        """The provider sent a preemption or rebalance notice to the VM."""

    def exited(self, report: ExitReport) -> None:
        """The job's command on the VM ended with ``report.exit_code``."""


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
    def heartbeat(report: AgentReport, creds: _Credentials) -> None:
        authorize(creds, report)
        reports.heartbeat(report)

    @router.post(NOTICE_PATH, status_code=204)
    def notice(report: NoticeReport, creds: _Credentials) -> None:
        authorize(creds, report)
        reports.notice(report)

    @router.post(EXIT_PATH, status_code=204)
    def exited(report: ExitReport, creds: _Credentials) -> None:
        authorize(creds, report)
        reports.exited(report)

    return router
