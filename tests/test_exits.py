"""spotd.exits: a node's exit kept beside the checkpoints, read back by the daemon."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotd.checkpoints import join
from spotd.core.agent_wire import ExitReport, NoticeReport
from spotd.core.errors import CheckpointError
from spotd.exits import FOLDER, KeptExit, keep_exit, kept_exits

AT = datetime(2026, 12, 4, 6, 0, tzinfo=UTC)


def exit_of(instance: str, code: int, *, job: str = "j-1", attempt: int = 2) -> ExitReport:
    return ExitReport(job_id=job, attempt=attempt, instance_id=instance, provider="sim-aws",
                      at=AT, exit_code=code)  # fmt: skip


@pytest.mark.parametrize("scheme", ["", "file://", "memory://"])
def test_kept_exits_are_read_back_per_attempt(tmp_path: Path, scheme: str) -> None:
    root = f"memory://{tmp_path}/ckpt" if scheme == "memory://" else f"{scheme}{tmp_path}/ckpt"
    notice = NoticeReport(job_id="j-1", attempt=2, instance_id="i/2", provider="sim-aws", at=AT,
                          kind="preemption")  # fmt: skip
    keep_exit(root, KeptExit(exit=exit_of("i-1", 0)))
    keep_exit(root, KeptExit(exit=exit_of("i/2", 143), notice=notice))
    keep_exit(root, KeptExit(exit=exit_of("i-1", 1, attempt=3)))
    keep_exit(root, KeptExit(exit=exit_of("i-1", 7, job="j-2")))

    found = kept_exits(root, "j-1", 2)

    assert {iid: k.exit.exit_code for iid, k in found.items()} == {"i-1": 0, "i/2": 143}
    assert found["i/2"].notice == notice
    assert kept_exits(root, "j-1", 3)["i-1"].exit.exit_code == 1
    assert kept_exits(root, "j-1", 9) == {}
    assert kept_exits(f"{root}-never-written", "j-1", 2) == {}


def test_a_foreign_or_torn_file_is_skipped(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    keep_exit(root, KeptExit(exit=exit_of("i-1", 0)))
    folder = tmp_path / "ckpt" / FOLDER / "j-1" / "attempt-2"
    (folder / "torn.json").write_text('{"exit": {"job_id": "j-1"')
    # A record of another attempt copied into this attempt's folder.
    other = KeptExit(exit=exit_of("i-9", 3, attempt=1)).model_dump_json()
    (folder / "i-9.json").write_text(other)

    assert list(kept_exits(root, "j-1", 2)) == ["i-1"]


def test_an_unreadable_location_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError):
        kept_exits(join(str(tmp_path / "file"), "x"), "j-1", 2)
    with pytest.raises(CheckpointError):
        kept_exits("nosuchscheme://x", "j-1", 2)
