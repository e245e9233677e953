"""The egress finding every provider's ``check-cloud`` words the same way."""

from __future__ import annotations

import pytest

from spotd.core.egress import checkpoint_scheme, no_way_out, public_nodes, way_out
from spotd.core.values import Reach


@pytest.mark.parametrize(("uri", "scheme"), [
    ("s3://bucket/j", "s3"), ("gs://bucket/j", "gs"), ("simplecache::az://c/j", "az"),
    ("/mnt/ckpt/j", ""), ("file:///mnt/ckpt", ""),
])  # fmt: skip
def test_the_store_is_read_from_the_checkpoint_uri(uri: str, scheme: str) -> None:
    assert checkpoint_scheme({"SPOTD_CHECKPOINT_URI": uri}) == scheme


def test_without_a_job_the_store_is_unknown() -> None:
    assert checkpoint_scheme({}) is None


def test_no_way_out_names_what_cannot_be_reached_and_the_fix() -> None:
    found = no_way_out("subnet a", fix="Add a NAT.", env={"SPOTD_CHECKPOINT_URI": "s3://b/j"})
    assert found.name == "egress subnet a" and not found.ok
    assert found.unreachable == (Reach.DAEMON, Reach.PACKAGE_INDEX, Reach.CHECKPOINT_STORE)
    assert "cannot reach the daemon, package index or checkpoint store" in found.detail
    assert found.detail.endswith("Add a NAT.")


def test_a_private_path_to_the_store_or_a_local_store_leaves_two() -> None:
    served = no_way_out("subnet a", fix="x", env={}, store_path="an endpoint")
    local = no_way_out("subnet a", fix="x", env={"SPOTD_CHECKPOINT_URI": "/mnt/c"})
    for found in (served, local):
        assert found.unreachable == (Reach.DAEMON, Reach.PACKAGE_INDEX)
    assert "reachable through an endpoint" in served.detail


def test_passes_carry_no_finding() -> None:
    for found in (way_out("subnet a", "NAT gateway n"), public_nodes("subnet a", "why")):
        assert found.ok and found.unreachable == ()
