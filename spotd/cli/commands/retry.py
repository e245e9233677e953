"""The commands on a job that failed or was cancelled: ``retry`` and ``release``."""

from __future__ import annotations

import json

from spotd.cli.commands.options import ConfigOpt, JobArg, JsonOpt, settings_of
from spotd.cli.errors import guard
from spotd.cli.render.console import out


def retry(job: JobArg, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Run a failed or cancelled job again under its id: a new attempt resumes from its
    last complete checkpoint, and the job keeps its earlier attempts and their cost
    (its budget covers them all). Nodes it keeps for inspection are stopped."""
    from spotd.cli.client import Client

    view = guard(lambda: Client.from_settings(settings_of(config)).retry(job))
    if as_json:
        out.print_json(json.dumps(view.model_dump(mode="json")))
        return
    out.print(f"{view.id} {view.status}: retried as attempt {len(view.attempts) + 1}; its "
              "daemon's next pass places it, to resume from its last complete checkpoint",
              highlight=False)  # fmt: skip


def release(job: JobArg, config: ConfigOpt = None) -> None:
    """Stop the nodes a failed job keeps for inspection (``keep_on_failure``) now, before
    its hold runs out: its daemon's next pass stops them and bills the time they ran."""
    from spotd.cli.client import Client

    view = guard(lambda: Client.from_settings(settings_of(config)).release(job))
    out.print(f"{view.id}: release of its kept nodes asked; its daemon's next pass stops them",
              highlight=False)  # fmt: skip
