"""Where :class:`spotd.train.Run` and its parts say what they did.

One line per message, prefixed ``spotd.train:``, from global rank 0 only unless a
message is about this rank alone; to stderr, or to the callable the job gave.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["RankLog"]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class RankLog:
    """The library's log lines of one rank."""

    def __init__(self, sink: Callable[[str], None] | None, *, is_main: bool) -> None:
        self._sink = sink or _stderr
        self._is_main = is_main

    def __call__(self, message: str, all_ranks: bool = False) -> None:
        """One log line; from rank 0 only unless ``all_ranks``."""
        if all_ranks or self._is_main:
            self._sink(f"spotd.train: {message}")
