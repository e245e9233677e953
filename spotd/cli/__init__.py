"""The ``spotd`` command line: commands (:mod:`spotd.cli.app`), the API client, the demos."""

from __future__ import annotations


def main() -> None:
    """Run the ``spotd`` command (the console script's target)."""
    from spotd.cli.app import main as run

    run()
