"""spotd.core.endpoints: an endpoint override is http(s), and plain http only on loopback."""

from __future__ import annotations

import pytest

from spotd.core.endpoints import checked_endpoint


def test_https_anywhere_and_http_on_loopback_pass_without_a_trailing_slash() -> None:
    assert checked_endpoint(None) is None
    assert checked_endpoint("https://compute.example.com/") == "https://compute.example.com"
    for host in ("127.0.0.1", "localhost", "[::1]"):
        assert checked_endpoint(f"http://{host}:8080/") == f"http://{host}:8080"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("http://10.0.0.5:8080", "only on loopback"),  # a token in clear text off the host
        ("ftp://127.0.0.1", r"must be an http\(s\) URL"),
        ("https://", r"must be an http\(s\) URL"),
        ("compute.example.com", r"must be an http\(s\) URL"),
    ],
)
def test_anything_else_is_refused_with_why(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        checked_endpoint(value)
