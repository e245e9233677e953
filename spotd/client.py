"""The CLI's side of the HTTP API: finds the daemon, sends the token, maps errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import TypeAdapter

from spotd.config import Settings
from spotd.errors import ApiError
from spotd.spec import JobSpec
from spotd.views import EventView, JobView, MarketView

_JOBS = TypeAdapter(list[JobView])
_EVENTS = TypeAdapter(list[EventView])


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
        return cls(daemon_url(settings), token)

    def close(self) -> None:
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
            except ValueError:
                detail = response.text
            raise ApiError(f"{response.status_code}: {detail}")
        return response.json()

    def submit(self, spec: JobSpec) -> JobView:
        body = {"spec": spec.model_dump(mode="json")}
        return JobView.model_validate(self._call("POST", "/v1/jobs", json=body))

    def jobs(self, *, include_ended: bool = True) -> list[JobView]:
        return _JOBS.validate_python(
            self._call("GET", "/v1/jobs", params={"all": include_ended})
        )

    def job(self, ref: str) -> JobView:
        return JobView.model_validate(self._call("GET", f"/v1/jobs/{ref}"))

    def events(self, ref: str) -> list[EventView]:
        return _EVENTS.validate_python(self._call("GET", f"/v1/jobs/{ref}/events"))

    def cancel(self, ref: str) -> JobView:
        return JobView.model_validate(self._call("POST", f"/v1/jobs/{ref}/cancel"))

    def prices(self) -> MarketView:
        return MarketView.model_validate(self._call("GET", "/v1/prices"))

    def logs(self, ref: str) -> dict[str, str]:
        logs: dict[str, str] = self._call("GET", f"/v1/jobs/{ref}/logs")["logs"]
        return logs
