"""The HTML report renders in headless Chromium (skipped where no Chromium is installed)."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotd.billing import charts, reports
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import JobRecord, LedgerEntry

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def entry(day: int, provider: str, usd: float) -> LedgerEntry:
    start = datetime(2026, 5, day, 1, tzinfo=UTC)
    return LedgerEntry(
        job_id="j-0000000001", attempt=day, provider=provider, region="r1", zone="r1-a",
        instance_type="p5.48xlarge", gpu="H100", gpus=8, nodes=1, fabric="efa",
        market="spot", kind="compute", start=start, end=start.replace(hour=5),
        billed_seconds=4 * 3600, usd=usd, on_demand_usd=usd * 3, job_status="succeeded",
    )


def job() -> JobRecord:
    spec = JobSpec.model_validate({
        "name": "llm-ft", "command": ["true"],
        "resources": {"gpus": ["H100"], "gpus_per_node": 8},
    })  # fmt: skip
    at = datetime(2026, 5, 1, tzinfo=UTC)
    return JobRecord("j-0000000001", "llm-ft", spec, JobStatus.SUCCEEDED, None, at, at)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_html_report_renders_in_chromium(tmp_path: Path) -> None:
    report = reports.report_from(
        [entry(1, "aws", 120.0), entry(2, "gcp", 80.0)], {"j-0000000001": job()}, {},
        since=datetime(2026, 5, 1, tzinfo=UTC), until=datetime(2026, 5, 8, tzinfo=UTC),
    )
    html = reports.render_html(report, reports.data_uri_sources(charts.render_charts(report)))
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    shot = tmp_path / "shot.png"
    subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,1600",
         f"--screenshot={shot}", page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.std() > 0.05, "the page is not blank"
