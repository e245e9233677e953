"""Every error answer of the API is a problem (RFC 9457), and docs/operations.md lists
the codes as the table does."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from pathlib import Path

import httpx
import pytest
from engine_support import spec
from sqlalchemy import event

from spotd.core import errors
from spotd.core.errors import (
    BadCursor,
    FieldProblem,
    IdempotencyKeyReused,
    JobNotFound,
    JobSpecError,
    RequestInvalid,
    SpotdError,
    StoreUnavailable,
    SubmitRefused,
    error_classes,
)
from spotd.daemon.api import create_app
from spotd.daemon.problems import (
    PROBLEM_MEDIA_TYPE,
    Problem,
    error_from_problem,
    http_problem,
    one_line,
    problem_of,
    status_of,
)
from spotd.daemon.wiring import build_reader
from spotd.engine.reconcile import Engine
from spotd.store.sql import SqlStore

TOKEN = "t" * 32
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
TABLE_START = (
    "<!-- problem codes: generated from spotd.daemon.problems by tests/daemon/test_problems.py -->"
)
TABLE_END = "<!-- end of problem codes -->"


def send(
    engine: Engine, method: str, path: str, *, token: str = TOKEN, **kw: object
) -> httpx.Response:
    """One request through the app in process; an unexpected error answers as a server's would."""

    async def go() -> httpx.Response:
        app = create_app(build_reader(engine), TOKEN)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://spotd") as client:
            headers = {"Authorization": f"Bearer {token}", **kw.pop("headers", {})}  # type: ignore[dict-item]
            return await client.request(method, path, headers=headers, **kw)  # type: ignore[arg-type]

    return asyncio.run(go())


def problem(reply: httpx.Response, status: int, code: str) -> dict[str, object]:
    """The reply's problem, checked for its status, code, media type and members."""
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == PROBLEM_MEDIA_TYPE
    body: dict[str, object] = reply.json()
    assert body["status"] == status and body["code"] == code, body
    assert body["type"] == f"urn:spotd:problem:{code}"
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and "\n" not in body["detail"]
    return body


# -- what the API answers -------------------------------------------------------------


def test_an_unknown_job_is_a_404_problem(engine: Engine) -> None:
    body = problem(send(engine, "GET", "/v1/jobs/j-nope"), 404, "job-not-found")
    assert body["detail"] == "no job with id, id prefix or name 'j-nope'"
    assert body["title"] == "Job not found"


def test_a_job_already_ended_is_a_409_naming_it(engine: Engine) -> None:
    job = engine.store.create_job(spec(), now=engine.clock.now())
    assert send(engine, "POST", f"/v1/jobs/{job.id}/cancel").status_code == 202
    engine.tick()  # the loop carries the cancel out
    body = problem(send(engine, "POST", f"/v1/jobs/{job.id}/cancel"), 409, "illegal-transition")
    assert body["job_id"] == job.id and body["detail"] == f"job {job.id} already cancelled"


def test_an_unknown_route_and_a_wrong_method_are_problems(engine: Engine) -> None:
    body = problem(send(engine, "GET", "/v1/nope"), 404, "route-not-found")
    assert body["detail"] == "not found: GET /v1/nope"
    body = problem(send(engine, "DELETE", "/v1/jobs"), 405, "method-not-allowed")
    assert body["detail"] == "method not allowed: DELETE /v1/jobs"


def test_a_spec_the_daemon_cannot_read_names_each_field_on_one_line(engine: Engine) -> None:
    bad = {"name": "t", "command": [1], "resources": {"gpus": ["A100"]}, "bogus": 1}
    body = problem(send(engine, "POST", "/v1/jobs", json={"spec": bad}), 422, "invalid-request")
    fields = [e["field"] for e in body["errors"]]  # type: ignore[attr-defined]
    assert fields == ["spec.command[0]", "spec.resources.gpus_per_node", "spec.bogus"], body
    assert body["detail"] == (
        "invalid request: spec.command[0]: Input should be a valid string; "
        "spec.resources.gpus_per_node: Field required; spec.bogus: Extra inputs are not permitted"
    )
    assert "field" not in body, "one field only is named at the top"
    assert engine.store.list_jobs() == []


def test_broken_json_and_a_parameter_out_of_range_are_invalid_requests(engine: Engine) -> None:
    broken = send(engine, "POST", "/v1/jobs", content=b'{"spec": ',
                  headers={"Content-Type": "application/json"})  # fmt: skip
    body = problem(broken, 422, "invalid-request")
    assert body["field"] == "body"
    assert str(body["detail"]).startswith("invalid request: body: not JSON")
    body = problem(send(engine, "GET", "/v1/jobs", params={"limit": "0"}), 422, "invalid-request")
    least = "Input should be greater than or equal to 1"
    assert body["errors"] == [{"field": "limit", "message": least}]
    body = problem(send(engine, "GET", "/v1/jobs", params={"status": "x"}), 422, "invalid-request")
    assert body["field"] == "status" and str(body["detail"]).startswith("status: 'x' is not one of")


def test_a_secret_the_daemon_lacks_is_a_refusal_naming_the_field(engine: Engine) -> None:
    held = spec().model_dump(mode="json") | {"secrets": ["WANDB_KEY"]}
    body = problem(send(engine, "POST", "/v1/jobs", json={"spec": held}), 422, "submit-refused")
    assert body["field"] == "secrets" and "WANDB_KEY" in str(body["detail"])


def test_a_reused_key_is_a_409_naming_the_job(engine: Engine) -> None:
    key = {"Idempotency-Key": "k-1"}
    first = send(engine, "POST", "/v1/jobs", json={"spec": spec().model_dump(mode="json")},
                 headers=key)  # fmt: skip
    other = {"spec": spec("print(2)").model_dump(mode="json")}
    body = problem(send(engine, "POST", "/v1/jobs", json=other, headers=key), 409,
                   "idempotency-key-reused")  # fmt: skip
    assert body["job_id"] == first.json()["id"] and body["field"] == "Idempotency-Key"


def test_an_unexpected_error_is_a_500_that_tells_nothing_of_it(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(ref: str) -> None:
        raise RuntimeError("/srv/secret/path exploded")

    monkeypatch.setattr(engine.store, "find_job", broken)
    body = problem(send(engine, "GET", "/v1/jobs/j-1"), 500, "internal-error")
    assert "secret" not in json.dumps(body)
    assert body["detail"] == (
        "the daemon failed on an unexpected error (RuntimeError); its log has the traceback"
    )


def test_a_full_database_is_a_503_with_the_databases_own_short_reason(engine: Engine) -> None:
    store = engine.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()

    def capped(dbapi: object, _record: object) -> None:
        dbapi.execute(f"PRAGMA max_page_count={pages}")  # type: ignore[attr-defined]

    event.listen(store.engine, "connect", capped)
    store.engine.dispose()
    body: dict[str, object] = {}
    for _ in range(50):  # a few pages are free: fill them
        reply = send(engine, "POST", "/v1/jobs", json={"spec": spec().model_dump(mode="json")})
        if reply.status_code != 201:
            body = problem(reply, 503, "store-unavailable")
            break
    assert body["detail"] == "the store is unavailable: database or disk is full"
    assert "sqlite" not in reply.text.lower() and "sqlalche" not in reply.text


def test_the_dashboards_redirect_to_its_login_stays_a_redirect(engine: Engine) -> None:
    reply = send(engine, "GET", "/dashboard/jobs", token="")
    assert reply.status_code == 303 and reply.headers["location"].startswith("/dashboard/login")


# -- the envelope itself ----------------------------------------------------------------


def samples() -> list[SpotdError]:
    """An error of every class of the tree, with the members that apply."""
    made: list[SpotdError] = [
        JobSpecError("job.toml", ["name: field required", "resources.gpus (line 4): unknown"]),
        RequestInvalid("invalid request: a: x; b: y", [FieldProblem("a", "x"),
                                                        FieldProblem("b", "y")]),
        JobNotFound("no job 'j-1'", job_id="j-1"),
        StoreUnavailable("the store is unavailable: disk full", cause="disk full"),
        SubmitRefused("checkpoint.uri: no", field="checkpoint.uri"),
        IdempotencyKeyReused("Idempotency-Key 'k' was used", job_id="j-2"),
        BadCursor("cursor: 'x' is not a job listing cursor"),
    ]
    special = {type(e) for e in made}
    tree = [c for c in error_classes() if c.__module__ == errors.__name__ and c not in special]
    return made + [cls(f"{cls.__name__} happened") for cls in tree]


@pytest.mark.parametrize("exc", samples(), ids=lambda e: type(e).__name__)
def test_a_problem_raises_its_own_class_again(exc: SpotdError) -> None:
    sent = problem_of(exc)
    assert sent.status == status_of(type(exc)) and sent.code == type(exc).error_code
    got = error_from_problem(Problem.model_validate_json(sent.body()))
    assert type(got) is type(exc)
    assert str(got) == (str(exc) if isinstance(exc, JobSpecError) else sent.detail)
    for member in ("job_id", "field", "problems", "source"):
        assert getattr(got, member, None) == getattr(exc, member, None), member


def test_an_unknown_code_comes_back_as_the_class_of_its_status() -> None:
    newer = http_problem(404, "no such thing").model_copy(update={"code": "from-the-future"})
    got = error_from_problem(newer)
    assert type(got).__name__ == "RouteNotFound" and str(got) == "no such thing"
    odd = http_problem(418, "teapot")
    assert type(error_from_problem(odd)).__name__ == "ApiError"


def test_a_message_of_several_lines_is_one_line() -> None:
    spec_error = JobSpecError("job.toml", ["name: field required", "gpus: unknown"])
    assert one_line(str(spec_error)) == (
        "job.toml: invalid job spec: name: field required; gpus: unknown"
    )
    assert one_line("plain") == "plain"


# -- the docs ---------------------------------------------------------------------------


def _summary(cls: type[SpotdError]) -> str:
    """The first sentence of the class's docstring, in Markdown."""
    first = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]
    text = " ".join(first.split())
    text = re.sub(r":\w+:`~?(?:[\w.]*\.)?(\w+)`", r"`\1`", text).replace("``", "`")
    sentence = re.match(r"(.+?)[.;:](\s|$)", text)
    text = sentence.group(1) if sentence else text
    return re.sub(r" \(\d{3}\)$", "", text)


def code_table() -> str:
    """The docs' table: every class of the tree, by status then code."""
    tree = [c for c in error_classes() if c.__module__ == errors.__name__]
    rows = ["| Status | `code` | Raised as | What it means |", "|---|---|---|---|"]
    for cls in sorted(tree, key=lambda c: (int(status_of(c)), c.error_code)):
        rows.append(f"| {int(status_of(cls))} | `{cls.error_code}` | `{cls.__name__}` | "
                    f"{_summary(cls)} |")  # fmt: skip
    return "\n".join(rows)


def test_the_docs_list_every_code_as_the_table_has_it() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    assert TABLE_START in text and TABLE_END in text, "docs/operations.md lost its code table"
    shown = text.split(TABLE_START)[1].split(TABLE_END)[0].strip()
    assert shown == code_table(), f"paste this into docs/operations.md:\n{code_table()}"
