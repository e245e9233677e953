"""``spotd demo``: an example job on the simulated market, through preemptions."""

from __future__ import annotations

import sys
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel

from spotd.cli.commands.options import JsonOpt
from spotd.cli.errors import ExitCode, guard, stopped
from spotd.cli.render.console import err, out


class DemoExample(StrEnum):
    """The jobs ``spotd demo`` can run."""

    TINY = "tiny"
    """examples/train_tiny.py: one node, numpy."""
    DDP = "ddp"
    """examples/train_ddp.py: 2 nodes x 2 processes, PyTorch DDP on gloo, DCP checkpoints."""


def demo(
    as_json: JsonOpt = False,
    example: Annotated[
        DemoExample, typer.Option(help="tiny: one numpy node; ddp: 2 nodes x 2 PyTorch ranks.")
    ] = DemoExample.TINY,
    seed: Annotated[int, typer.Option(help="Seed of the simulated market (tiny).")] = 11,
    steps: Annotated[
        int | None, typer.Option(help="Training steps (default: 300 tiny, 120 ddp).")
    ] = None,
    keep: Annotated[
        Path | None,
        typer.Option(help="Keep the demo's files in this folder, its figures in summary.json."),
    ] = None,
) -> None:
    """Run an example job on the simulated market through preemptions, then summarise.

    Ctrl-C stops it: its daemon and nodes are stopped, and its folder removed unless
    --keep names one."""
    try:
        if example is DemoExample.DDP:
            _demo_ddp(as_json, steps, keep)
        else:
            _demo_tiny(as_json, seed, steps, keep)
    except KeyboardInterrupt:
        # Each demo cleaned up on its way out (spotd.cli.demo.demo_folder, stop_daemon).
        files = "its folder removed" if keep is None else f"its files kept in {keep}"
        stopped(f"interrupted; the demo's daemon and nodes are stopped, {files}")


def _demo_tiny(as_json: bool, seed: int, steps: int | None, keep: Path | None) -> None:
    from spotd.cli.demo import DemoOptions, run_demo

    options = DemoOptions(seed=seed, steps=steps or 300, keep=keep, quiet=as_json)
    summary = guard(lambda: run_demo(options, console=err))
    _keep_summary(summary, keep)
    if as_json:
        sys.stdout.write(summary.model_dump_json(indent=2) + "\n")
    else:
        from spotd.cli.demo import print_summary

        print_summary(summary, out)
    if summary.status != "succeeded":
        raise typer.Exit(ExitCode.FAILED)


def _keep_summary(summary: BaseModel, keep: Path | None) -> None:
    """A kept folder holds the figures too (``summary.json``, as ``--json`` prints them),
    so a run read for its words keeps its numbers."""
    if keep is not None:
        (keep / "summary.json").write_text(summary.model_dump_json(indent=2) + "\n")


def _demo_ddp(as_json: bool, steps: int | None, keep: Path | None) -> None:
    from spotd.cli.demo_ddp import DdpDemoOptions, print_ddp_summary, run_ddp_demo

    options = DdpDemoOptions(keep=keep, quiet=as_json)
    if steps is not None:
        options = replace(options, steps=steps)
    summary = guard(lambda: run_ddp_demo(options, console=err))
    _keep_summary(summary, keep)
    if as_json:
        sys.stdout.write(summary.model_dump_json(indent=2) + "\n")
    else:
        print_ddp_summary(summary, out)
    if summary.status != "succeeded" or not summary.digest_matches:
        raise typer.Exit(ExitCode.FAILED)
