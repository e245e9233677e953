"""The ``spotd`` command line: the app (:mod:`spotd.cli.app`), its commands
(:mod:`spotd.cli.commands`) and what they print (:mod:`spotd.cli.render`), the API
client, the demos."""

from __future__ import annotations


def main() -> None:
    """Run the ``spotd`` command (the console script's target)."""
    from spotd.cli.app import main as run

    run()
