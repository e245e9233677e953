"""``spotd retry`` end to end on the embedded default (SQLite, the simulated market): a
job that checkpoints is cancelled mid-run, retried, and resumes from its checkpoint
under the same id, its first attempt and that attempt's cost kept."""

from __future__ import annotations

import json
import time
from pathlib import Path

from daemon_support import Daemon, make_setup, wait_for

from spotd import checkpoints
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, EventCause
from spotd.daemon.config import load_settings
from spotd.daemon.wiring import build_providers
from spotd.store import open_store


def test_a_cancelled_job_retried_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    setup = make_setup(tmp_path, seed=5, up=500.0)  # a calm market: no preemption
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup)
    ckpt = str(setup.root / "ckpt")
    try:
        job_id = json.loads(setup.cli("submit", str(setup.job_file), "--json").stdout)["id"]

        def checkpointed(job: object, _: int) -> bool:
            latest = checkpoints.latest_complete(ckpt)
            return latest is not None and latest.step > 0

        wait_for(store, job_id, lambda j, n: j.status is JobStatus.RUNNING and checkpointed(j, n))
        assert "cancelled" in setup.cli("cancel", job_id).stdout
        latest = checkpoints.latest_complete(ckpt)
        assert latest is not None and latest.step > 0
        # The ledger is written in the pass that ends the job, just after its move.
        wait_for(store, job_id, lambda j, n: bool(store.ledger(job_id=job_id)), timeout=30)
        billed = [(e.kind, e.start, e.usd) for e in store.ledger(job_id=job_id)]

        said = setup.cli("retry", job_id).stdout
        assert f"{job_id} recovering: retried as attempt 2" in said, said
        wait_for(store, job_id, lambda j, n: j.status is JobStatus.RUNNING and n == 2)

        first, second = store.attempts(job_id)
        assert first.end_reason is AttemptEnd.CANCELLED
        assert second.resume_from == latest.uri
        # The node of the new attempt loaded that checkpoint: it goes on from its step.
        provider = build_providers(load_settings(setup.config))[1][second.pool.provider]
        (node,) = second.instance_ids
        limit = time.monotonic() + 30
        while "resumed from step" not in provider.logs(node) and time.monotonic() < limit:
            time.sleep(0.05)
        assert f"resumed from step {latest.step}\n" in provider.logs(node)

        view = json.loads(setup.cli("status", job_id, "--json").stdout)
        assert view["id"] == job_id and [a["seq"] for a in view["attempts"]] == [1, 2]
        assert view["attempts"][0]["cost_usd"] == round(sum(usd for _, _, usd in billed), 6)
        kept = [(e.kind, e.start, e.usd) for e in store.ledger(job_id=job_id) if e.attempt == 1]
        assert kept == billed, "the first attempt's lines are kept as they were"
        causes = [e.cause for e in store.events(job_id)]
        assert causes.count(EventCause.RETRIED) == 1
        setup.cli("cancel", job_id)
    finally:
        assert daemon.stop() == 0
        store.close()
