"""spotd.cli.render.cells: table cells wrap between names, never inside one."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from rich.console import Console

from spotd.cli.render.cells import SLUG_BREAKS, Breakable, FittedTable, layout, with_minimums
from spotd.cli.render.jobs import events_table, status_table
from spotd.daemon.views import AttemptView, EventView, JobView

NOW = datetime(2026, 1, 5, 10, 30, tzinfo=UTC)
CKPT = "/var/lib/spotd/checkpoints/llama-70b-ft/step-00012000"


def rendered(renderable: object, width: int) -> str:
    shown = io.StringIO()
    Console(file=shown, width=width, force_terminal=False).print(renderable)
    return shown.getvalue()


def test_layout_breaks_at_spaces_then_after_a_paths_slashes() -> None:
    assert layout("resuming from " + CKPT, 30) == [
        "resuming from", "/var/lib/spotd/checkpoints/", "llama-70b-ft/step-00012000",
    ]  # fmt: skip
    assert layout("a b c", 80) == ["a b c"]
    assert layout("sim-aws/us-east-1a/p4d.24xlarge (spot)", 20) == [
        "sim-aws/us-east-1a/", "p4d.24xlarge (spot)",
    ]  # fmt: skip


def test_a_name_wider_than_the_column_is_left_whole_for_the_last_resort() -> None:
    digest = "sha256-" + "ab" * 32
    assert layout(f"code/{digest}.tar.gz", 20) == ["code/", f"{digest}.tar.gz"]


def test_a_slug_breaks_after_its_dashes() -> None:
    assert layout("llama-70b-finetune-v2", 12, SLUG_BREAKS) == ["llama-70b-", "finetune-v2"]


def test_minimums_are_met_from_the_columns_with_room_to_spare() -> None:
    assert with_minimums([10, 30, 40], [10, 25, 20], 80) == [10, 30, 40]
    assert with_minimums([14, 13, 13, 40], [14, 9, 21, 10], 80) == [14, 13, 21, 32]
    # Not all can be met: left as rich had them.
    assert with_minimums([40, 40], [50, 50], 80) == [40, 40]


def _job(name: str, instance_type: str) -> JobView:
    attempt = AttemptView.model_validate({
        "seq": 1, "provider": "sim-azure", "region": "westus3", "zone": "westus3-2",
        "instance_type": instance_type, "market": "spot", "nodes": 1,
        "price_per_node_hour": 9.5, "instance_ids": ["i-1"], "started_at": NOW,
        "running_at": NOW, "ended_at": None, "end_reason": None, "cost_usd": 1.0,
        "resume_from": None,
    })  # fmt: skip
    return JobView(
        id="j-41f68be2c3", name=name, status="running", failure=None, submitted_at=NOW,
        updated_at=NOW, preemptions=12, providers=["sim-azure"], cost_usd=1234.5,
        attempts=[attempt], spec={},
    )  # fmt: skip


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_status_table_keeps_every_name_whole(width: int) -> None:
    job = _job("llama-70b-finetune-with-a-long-name", "Standard_ND96asr_v4")
    text = rendered(status_table([job]), width)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    # Folded anywhere, a piece would be split over two lines and not found whole.
    pieces = ["j-41f68be2c3", "sim-azure/", "westus3-2/", "Standard_ND96asr_v4", "(spot)",
              "llama-", "70b-", "finetune-", "with-", "long-", "name", "1,234.50"]  # fmt: skip
    for piece in pieces:
        assert piece in text, (piece, text)


@pytest.mark.parametrize("width", [80, 100, 160])
def test_the_event_detail_puts_a_path_on_its_own_lines_broken_at_slashes(width: int) -> None:
    event = EventView(at=NOW, from_status="running", to_status="recovering",
                      cause="preempted", detail=f"resuming from {CKPT}")  # fmt: skip
    text = rendered(events_table([event]), width)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    for piece in ("/var/", "lib/", "spotd/", "checkpoints/", "llama-70b-ft/", "step-00012000"):
        assert piece in text, (piece, text)
    if width == 160:
        assert CKPT in text  # room for it whole on one line
    # Read back down the column, the detail is the path as it was.
    detail = [line[text.splitlines()[1].index("resuming"):].strip()
              for line in text.splitlines()[1:] if line.strip()]  # fmt: skip
    assert " ".join(detail).replace("/ ", "/") == f"resuming from {CKPT}", detail


def test_a_breakable_cell_is_plain_text_in_a_plain_table() -> None:
    table = FittedTable("A", "B")
    table.add_row("x", Breakable("sim-gcp/us-east4-a/a2-highgpu-1g (spot)"))
    assert "sim-gcp/us-east4-a/a2-highgpu-1g (spot)" in rendered(table, 200)
    assert str(Breakable("a/b")) == "a/b"


def test_a_table_printed_narrow_then_wide_gets_its_spacing_back() -> None:
    table = FittedTable("ID", "WHERE", box=None)
    table.add_row("j-41f68be2c3", Breakable("sim-azure/westus3-2/Standard_ND96asr_v4 (spot)"))
    # 34 columns: room for both whole names with one space between, not with two.
    narrow = rendered(table, 34)
    assert "j-41f68be2c3 sim-azure/" in narrow and "Standard_ND96asr_v4" in narrow, narrow
    assert "j-41f68be2c3  sim-azure/westus3-2/" in rendered(table, 200)
