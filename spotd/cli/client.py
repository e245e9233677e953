"""The CLI's side of the HTTP API: finds the daemon, sends the token, maps errors."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from spotd.core.errors import ApiError
from spotd.core.spec import JobSpec
from spotd.daemon.config import Settings
from spotd.daemon.views import EventView, JobView, MarketView

if TYPE_CHECKING:
    from spotd.daemon.planning import PlanView

T = TypeVar("T")
_JOB = TypeAdapter(JobView)
_JOBS = TypeAdapter(list[JobView])
_EVENTS = TypeAdapter(list[EventView])
_MARKET = TypeAdapter(MarketView)
_LOGS = TypeAdapter(dict[str, dict[str, str]])


def daemon_url(settings: Settings) -> str:
    """The running daemon's base URL, from its address file or the configuration."""
    host, port = settings.daemon.host, settings.daemon.port
    try:
        info = json.loads(settings.address_file.read_text())
        host, port = info["host"], int(info["port"])
    except (OSError, ValueError, KeyError):
        pass
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


class Client:
    """Typed calls to the daemon's API."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0) -> None:
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Client:
        """A client for the daemon that ``settings`` describe."""
        try:
            token = settings.token_file.read_text().strip()
        except OSError as exc:
            raise ApiError(
                f"cannot read the API token at {settings.token_file} ({exc.strerror}); "
                "is `spotd daemon` running with the same data_dir?"
            ) from exc
        url = daemon_url(settings)
        if url.endswith(":0"):  # the daemon picks its port; only its address file tells it
            raise ApiError(
                f"no spotd daemon is running with data_dir {settings.data_dir} (it writes "
                f"{settings.address_file.name} there while it runs); start it with `spotd daemon`"
            )
        return cls(url, token)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(
                f"cannot reach the spotd daemon at {self._http.base_url}: {exc}; "
                "start it with `spotd daemon`"
            ) from exc
        if response.is_error:
            try:
                detail = response.json().get("detail", response.text)
            except (ValueError, AttributeError):
                detail = response.text
            # A refusal (4xx) is told as the daemon put it; a failure says whose it was.
            if response.status_code >= 500:
                raise ApiError(f"the daemon failed ({response.status_code}): {detail}")
            raise ApiError(str(detail))
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(f"{method} {path}: the daemon's reply is not JSON") from exc

    def _typed(self, shape: TypeAdapter[T], method: str, path: str, **kwargs: Any) -> T:
        reply = self._call(method, path, **kwargs)
        try:
            return shape.validate_python(reply)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the reply"
            raise ApiError(
                f"{method} {path}: the daemon's reply does not read as this CLI expects "
                f"({where}: {first['msg']}); is the daemon another version of spotd?"
            ) from exc

    def submit(self, spec: JobSpec) -> JobView:
        """Hand a validated spec to the daemon; the job as stored."""
        body = {"spec": spec.model_dump(mode="json")}
        return self._typed(_JOB, "POST", "/v1/jobs", json=body)

    def jobs(self, *, include_ended: bool = True) -> list[JobView]:
        """Every job, or only the active ones."""
        return self._typed(_JOBS, "GET", "/v1/jobs", params={"all": include_ended})

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
        """Cancel a job and stop its instances."""
        return self._typed(_JOB, "POST", f"/v1/jobs/{ref}/cancel")

    def prices(self) -> MarketView:
        """The daemon's view of the market: offerings and each provider's poll."""
        return self._typed(_MARKET, "GET", "/v1/prices")

    def logs(self, ref: str) -> dict[str, str]:
        """The job's output per attempt and node, by heading."""
        return self._typed(_LOGS, "GET", f"/v1/jobs/{ref}/logs")["logs"]
