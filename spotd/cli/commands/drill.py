"""The ``drill`` command: have a running job's provider preempt one of its nodes."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape

from spotd.cli.commands.options import ConfigOpt, JobArg, JsonOpt, again, settings_of
from spotd.cli.errors import guard
from spotd.cli.render.console import out


def drill(
    job: JobArg,
    node: Annotated[
        int, typer.Option(min=0, help="The node to preempt, by its rank (0 first).")
    ] = 0,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Prove a running job's checkpoint and resume: its daemon's next pass has the node's
    provider preempt it through the provider's own mechanism, with its usual notice. The
    job checkpoints, its attempt ends preempted and it resumes, as after any preemption;
    the drill is billed like one. Only a spot node of a running job can be drilled."""
    from spotd.cli.client import Client

    view = guard(lambda: Client.from_settings(settings_of(config)).drill(job, node))
    if as_json:
        out.print_json(json.dumps(view.model_dump(mode="json")))
        return
    follow = again("events", view.id, config)
    out.print(f"{view.id}: drill of node {node} asked; its daemon's next pass has the provider "
              f"preempt it with its notice (`{escape(follow)}` shows the drill, the notice and "
              "the resume)", highlight=False)  # fmt: skip
