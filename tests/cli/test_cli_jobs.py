"""spotd.cli.commands.jobs: an empty ``spotd status`` says how to submit a first job."""

from __future__ import annotations

import json
from pathlib import Path

from daemon_support import Daemon, make_setup

from spotd.cli.commands.jobs import empty_status


def test_the_hint_names_the_config_it_was_given() -> None:
    assert empty_status(filtered=False, config=None) == (
        "no active jobs (`spotd status --all` lists ended ones too); submit one with "
        "`spotd submit job.toml` (docs/job-spec.md describes the file), or watch one run "
        "with `spotd demo`"
    )
    said = empty_status(filtered=True, config=Path("/etc/spotd/my spotd.toml"))
    assert said.startswith("no jobs match; submit one with `spotd submit job.toml --config "
                           "'/etc/spotd/my spotd.toml'`")  # fmt: skip


def test_a_daemon_with_no_jobs_gets_the_hint_not_an_empty_table(tmp_path: Path) -> None:
    setup = make_setup(tmp_path, seed=2)
    daemon = Daemon(setup)
    try:
        plain = setup.cli("status")
        every = setup.cli("status", "--all")
        as_json = setup.cli("status", "--json")
    finally:
        daemon.stop()
    hint = f"submit one with `spotd submit job.toml --config {setup.config}`"
    assert plain.stdout.startswith("no active jobs (`spotd status --all --config"), plain.stdout
    assert hint in plain.stdout and "ID" not in plain.stdout
    assert every.stdout.startswith("no jobs match; ") and hint in every.stdout
    assert json.loads(as_json.stdout) == []  # a script gets the empty list, no words
