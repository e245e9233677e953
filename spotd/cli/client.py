"""The CLI's side of the HTTP API: finds the daemon, sends the token, maps errors.

An error answer is a problem (:mod:`spotd.daemon.problems`): the client raises the
class its ``code`` names (a 404 ``job-not-found`` as
:class:`~spotd.core.errors.JobNotFound`), with its ``detail`` as the message. An
answer of another shape (a proxy's page, say) is an :class:`ApiError` with its text.

The client waits :data:`TIMEOUT_SECONDS` for an answer: longer than the
store's lock wait (SQLite's busy timeout, 30 s), so a daemon whose store is
busy answers with its own error before the client gives up. A submit carries
an ``Idempotency-Key`` and is retried once with it after a timeout: the daemon
returns the job the first try stored, if it did, rather than a second job.

A daemon restarting under the client: a refused connection, with an address
file that no longer names a live daemon (left by one killed, or removed by one
stopped after the client read it), is tried again at the address the next
daemon writes, for up to :data:`RESTART_WAIT_SECONDS`. Nothing was sent on a
refused connection, so the retry cannot do anything twice.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from spotd.core.clock import WALL
from spotd.core.errors import ApiError, SpotdError
from spotd.core.spec import JobSpec
from spotd.daemon.config import Settings
from spotd.daemon.logview import LogsView
from spotd.daemon.problems import Problem, error_from_problem
from spotd.daemon.views import EventView, JobPageView, JobView, MarketView

if TYPE_CHECKING:
    from spotd.core.contracts import Clock
    from spotd.daemon.planning import PlanView

T = TypeVar("T")
_JOB = TypeAdapter(JobView)
_PAGE = TypeAdapter(JobPageView)
_EVENTS = TypeAdapter(list[EventView])
_MARKET = TypeAdapter(MarketView)
_LOGS = TypeAdapter(LogsView)


@dataclass(frozen=True)
class DaemonAddress:
    """What a daemon's address file says: where it answers, and its pid."""

    url: str
    pid: int | None


def read_address(address_file: Path) -> DaemonAddress | None:
    """The address file's content; None when it is missing or unreadable (a daemon
    writes it whole, by a rename, so a half-written one is not seen)."""
    try:
        info = json.loads(address_file.read_text())
        url = _url(str(info["host"]), int(info["port"]))
        pid = info.get("pid")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return DaemonAddress(url, pid if type(pid) is int else None)


def _url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def daemon_url(settings: Settings) -> str:
    """The running daemon's base URL, from its address file or the configuration."""
    address = read_address(settings.address_file)
    if address is not None:
        return address.url
    return _url(settings.daemon.host, settings.daemon.port)


TIMEOUT_SECONDS = 45.0
"""How long the client waits for an answer: more than the store's lock wait
(``spotd.store.sql.SQLITE_BUSY_TIMEOUT_MS``, 30 s) and the work around it."""
RESTART_WAIT_SECONDS = 10.0
"""How long a refused client waits for a restarting daemon's address file: a
daemon writes it some 3 s after its process starts (2 cores), and systemd starts
a failed one again after 5 s (``RestartSec`` in deploy/spotd.service)."""
RESTART_POLL_SECONDS = 0.1
"""How often the address file is read again meanwhile."""
PAGE_SIZE = 500
"""Jobs per page when the client reads a listing through (the daemon's most is 1000)."""


def daemon_alive(address_file: Path) -> bool | None:
    """Whether the daemon that wrote ``address_file`` still runs (by its pid);
    None when the file is missing or names no pid."""
    address = read_address(address_file)
    if address is None or address.pid is None:
        return None
    return pid_alive(address.pid)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host."""
    if pid <= 0:
        return False  # 0 and below name process groups to os.kill, not a process
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # another user's process: there all the same
    return True


class Client:
    """Typed calls to the daemon's API.

    ``address_file``: the daemon's, when known; an unreachable daemon's message
    then says whether it is running, and a refused connection is tried again at
    the address a restarted daemon writes there, waiting up to ``restart_wait``
    seconds for it (by ``clock``). ``address``: what that file said when ``base_url``
    was read from it (:meth:`from_settings`).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = TIMEOUT_SECONDS,
        address_file: Path | None = None,
        address: DaemonAddress | None = None,
        restart_wait: float = RESTART_WAIT_SECONDS,
        clock: Clock = WALL,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            # Plain HTTP has nothing to verify; loading the CA bundle for it would
            # be a tenth of a quick command's time.
            verify=not base_url.startswith("http://"),
        )
        self._timeout = timeout
        self._address_file = address_file
        self._address = address
        self._url = base_url
        self._restart_wait = restart_wait
        self._clock = clock

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        restart_wait: float = RESTART_WAIT_SECONDS,
        clock: Clock = WALL,
    ) -> Client:
        """A client for the daemon that ``settings`` describe (``restart_wait`` and
        ``clock``: as the constructor's)."""
        try:
            token = settings.token_file.read_text().strip()
        except OSError as exc:
            raise ApiError(
                f"cannot read the API token at {settings.token_file} ({exc.strerror}); "
                "is `spotd daemon` running with the same data_dir?"
            ) from exc
        address = read_address(settings.address_file)
        url = _url(settings.daemon.host, settings.daemon.port) if address is None else address.url
        if url.endswith(":0"):  # the daemon picks its port; only its address file tells it
            raise ApiError(
                f"no spotd daemon is running with data_dir {settings.data_dir} (it writes "
                f"{settings.address_file.name} there while it runs); start it with `spotd daemon`"
            )
        return cls(url, token, address_file=settings.address_file, address=address,
                   restart_wait=restart_wait, clock=clock)  # fmt: skip

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise ApiError(_no_answer(self._http.base_url, self._timeout, method, path)) from exc
        except httpx.HTTPError as exc:
            raise ApiError(self._unreachable(exc)) from exc
        return self._read(method, path, response)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The request; refused, once more at a restarted daemon's address if one
        comes (nothing was sent on a refused connection: no request runs twice)."""
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.ConnectError:
            if not self._follow_restart():
                raise
        return self._http.request(method, path, **kwargs)

    def _follow_restart(self) -> bool:
        """Wait for the address file to name a live daemon other than the one that
        refused, and take its address; False when none comes within the wait, or
        when nothing says one is coming (no address file, then or now)."""
        if self._address_file is None:
            return False
        deadline = self._clock.monotonic() + self._restart_wait
        while True:
            now = read_address(self._address_file)
            if now is not None and now.pid is not None and pid_alive(now.pid):
                if self._refused_by(now):
                    return False  # it runs but refuses: not a restart, and its log tells
                self._take(now)
                return True
            if (now is None and self._address is None) or self._clock.monotonic() >= deadline:
                return False
            time.sleep(RESTART_POLL_SECONDS)

    def _refused_by(self, address: DaemonAddress) -> bool:
        """Whether ``address`` is that of the daemon just asked."""
        same_pid = self._address is None or self._address.pid == address.pid
        return address.url == self._url and same_pid

    def _take(self, address: DaemonAddress) -> None:
        self._http.base_url = httpx.URL(address.url)
        self._url = address.url
        self._address = address

    def _unreachable(self, exc: httpx.HTTPError) -> str:
        """No connection: running or not, as the address file and a health probe tell."""
        url = self._http.base_url
        if self._healthy():
            return f"the spotd daemon at {url} is running but the request failed: {exc}"
        address = None if self._address_file is None else read_address(self._address_file)
        pid = None if address is None else address.pid
        if pid is not None and pid_alive(pid):
            return (
                f"the spotd daemon at {url} is running (its pid is in {self._address_file}) "
                f"but does not answer: {exc}; see its log"
            )
        if pid is not None:  # its address file outlived it
            return (
                f"cannot reach a spotd daemon at {url} ({exc}): {self._address_file} names "
                f"pid {pid}, which is not running: that daemon did not stop cleanly, and no "
                f"new one wrote its address (waited {self._restart_wait:g} s for a new one); "
                "start it with `spotd daemon`"
            )
        return f"cannot reach a spotd daemon at {url} ({exc}); start it with `spotd daemon`"

    def _healthy(self) -> bool:
        try:
            return self._http.get("/v1/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _read(self, method: str, path: str, response: httpx.Response) -> Any:
        if response.is_error:
            raise _error_of(response)
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(f"{method} {path}: the daemon's reply is not JSON") from exc

    def _typed(self, shape: TypeAdapter[T], method: str, path: str, **kwargs: Any) -> T:
        return _shaped(shape, method, path, self._call(method, path, **kwargs))

    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> JobView:
        """Hand a validated spec to the daemon; the job as stored.

        ``idempotency_key`` (a fresh UUID when None) goes with the submit and its
        one retry after a timeout: the daemon stores one job per key. A spec the
        daemon will not run raises :class:`~spotd.core.errors.SubmitRefused` with the
        daemon's reason (:class:`~spotd.core.errors.IdempotencyKeyReused` for the key
        of a job of another spec).
        """
        key = idempotency_key or str(uuid.uuid4())
        body = {"spec": spec.model_dump(mode="json")}
        headers = {"Idempotency-Key": key}
        for _ in range(2):
            try:
                response = self._request("POST", "/v1/jobs", json=body, headers=headers)
                break
            except httpx.TimeoutException:
                continue  # the same key again: at most the one job the first try stored
            except httpx.HTTPError as exc:
                raise ApiError(self._unreachable(exc)) from exc
        else:
            raise ApiError(
                f"the spotd daemon at {self._http.base_url} did not answer the submit within "
                f"{self._timeout:g} s, twice; the job may have been stored: `spotd status` "
                f"shows it, and submitting again with `--idempotency-key {key}` is safe (it "
                "returns that job if it was stored, else submits it)"
            )
        return _shaped(_JOB, "POST", "/v1/jobs", self._read("POST", "/v1/jobs", response))

    def jobs(
        self,
        *,
        statuses: Collection[str] | None = None,
        team: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JobPageView:
        """One page of jobs, newest first: ``statuses`` are status names, ``active`` or
        ``ended`` (None: every job); ``team`` the jobs' ``team``; ``cursor`` the ``next``
        of the page before."""
        params: dict[str, Any] = {}
        if statuses:
            params["status"] = list(statuses)
        if team is not None:
            params["team"] = team
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        return self._typed(_PAGE, "GET", "/v1/jobs", params=params)

    def all_jobs(self, *, statuses: Collection[str] | None = None) -> Iterator[JobView]:
        """Every job (in ``statuses``), newest first, read page by page."""
        cursor: str | None = None
        while True:
            page = self.jobs(statuses=statuses, limit=PAGE_SIZE, cursor=cursor)
            yield from page.jobs
            if page.next is None:
                return
            cursor = page.next

    def job(self, ref: str) -> JobView:
        """One job by id, id prefix or name."""
        return self._typed(_JOB, "GET", f"/v1/jobs/{ref}")

    def events(self, ref: str) -> list[EventView]:
        """Every transition of a job, oldest first."""
        return self._typed(_EVENTS, "GET", f"/v1/jobs/{ref}/events")

    def plan(self, ref: str, policy: str | None = None) -> PlanView:
        """What the daemon's engine would choose for a submitted job now, and why
        (``policy``: ask that installed policy instead of the daemon's)."""
        from spotd.daemon.planning import PlanView  # the planner's imports: only for this call

        params = {"policy": policy} if policy is not None else {}
        return self._typed(TypeAdapter(PlanView), "GET", f"/v1/jobs/{ref}/plan", params=params)

    def cancel(self, ref: str) -> JobView:
        """Ask for a job to be cancelled: the job as it stands, the cancel in its ``asked``
        until the daemon that holds it has stopped it (:func:`wait_ended`)."""
        return self._typed(_JOB, "POST", f"/v1/jobs/{ref}/cancel")

    def retry(self, ref: str) -> JobView:
        """Retry a failed or cancelled job under its id: the job, now recovering; a daemon's
        next pass places it, to resume from its last complete checkpoint."""
        return self._typed(_JOB, "POST", f"/v1/jobs/{ref}/retry")

    def release(self, ref: str) -> JobView:
        """Ask for the nodes a failed job keeps for inspection to be stopped: the job as it
        stands, the release in its ``asked`` until its daemon has stopped them."""
        return self._typed(_JOB, "POST", f"/v1/jobs/{ref}/release")

    def drill(self, ref: str, node: int = 0) -> JobView:
        """Ask for a drill of node ``node`` (a rank) of a running job: the job as it stands,
        the drill in its ``asked`` until its daemon has had the provider preempt the node
        (:class:`~spotd.core.errors.DrillRefused` when it cannot have one now)."""
        return self._typed(_JOB, "POST", f"/v1/jobs/{ref}/drill", json={"node": node})

    def set_priority(self, ref: str, priority: int) -> JobView:
        """Ask for the job to have another priority (applied by its daemon's next pass)."""
        return self._typed(_JOB, "POST", f"/v1/jobs/{ref}/priority", json={"priority": priority})

    def prices(self) -> MarketView:
        """The daemon's view of the market: offerings and each provider's poll."""
        return self._typed(_MARKET, "GET", "/v1/prices")

    def logs(
        self,
        ref: str,
        *,
        attempt: int | None = None,
        node: int | None = None,
        after: str | None = None,
    ) -> LogsView:
        """The job's output per attempt and node (of attempt number ``attempt`` and node
        rank ``node`` only, if given); after ``after`` (a page's ``cursor``), only what
        came since."""
        asked = {"attempt": attempt, "node": node, "after": after or None}
        params = {k: v for k, v in asked.items() if v is not None}
        return self._typed(_LOGS, "GET", f"/v1/jobs/{ref}/logs", params=params)


def _no_answer(url: httpx.URL, timeout: float, method: str, path: str) -> str:
    """A timeout: the daemon at ``url`` is there (it accepted the connection) but busy."""
    return (
        f"the spotd daemon at {url} did not answer {method} {path} "
        f"within {timeout:g} s; it may be busy (its log tells), try again"
    )


def _error_of(response: httpx.Response) -> SpotdError:
    """The error an error answer tells: the class of its problem's code, else (an
    answer not from a spotd daemon) an :class:`ApiError` with its text."""
    try:
        return error_from_problem(Problem.model_validate_json(response.content))
    except ValidationError:
        pass
    try:
        detail = str(response.json().get("detail", response.text))
    except (ValueError, AttributeError):
        detail = response.text
    # A refusal (4xx) is told as it was put; a failure says whose it was.
    if response.status_code >= 500:
        return ApiError(f"the daemon failed ({response.status_code}): {detail}")
    return ApiError(detail)


def _shaped(shape: TypeAdapter[T], method: str, path: str, reply: Any) -> T:
    try:
        return shape.validate_python(reply)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the reply"
        raise ApiError(
            f"{method} {path}: the daemon's reply does not read as this CLI expects "
            f"({where}: {first['msg']}); is the daemon another version of spotd?"
        ) from exc


def wait_ended(
    client: Client,
    ref: str,
    *,
    timeout_seconds: float,
    poll_seconds: float = 0.2,
    clock: Clock = WALL,
) -> JobView:
    """The job once it has ended, or as it stands when ``timeout_seconds`` (real
    seconds, by ``clock``) have passed first: a cancel is asked, and done by the
    daemon that holds the job in its next pass."""
    deadline = clock.monotonic() + timeout_seconds
    job = client.job(ref)
    while not job.status_ended and clock.monotonic() < deadline:
        time.sleep(poll_seconds)
        job = client.job(ref)
    return job
