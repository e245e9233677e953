"""Table cells that wrap between names, never inside one.

rich wraps a cell at spaces, and a word wider than its column it folds anywhere
(``overflow="fold"``: ``/var/lib/spotd/checkpoi`` / ``nts/step-0000``) or cuts
(``"ellipsis"``). A :class:`Breakable` cell puts a word too wide for the column
on a line of its own and breaks it only after its separators (a path's ``/``),
so each name in it stays whole; only a single name wider than the whole column
is folded, as the last resort.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["PATH_BREAKS", "SLUG_BREAKS", "Breakable", "FittedTable", "layout", "with_minimums"]

PATH_BREAKS = "/"
"""Where a path, a URI or ``provider/zone/type`` may break."""
SLUG_BREAKS = "/-_."
"""Where a name such as a job's (``llama-70b-ft.v2``) may break as well."""


def _pieces(word: str, breaks: str) -> list[str]:
    """``word`` cut after each of its ``breaks``: ``/a/b`` is ``/``, ``a/``, ``b``."""
    if not breaks:
        return [word]
    chars = re.escape(breaks)
    return re.findall(f"[^{chars}]*[{chars}]|[^{chars}]+", word)


def layout(text: str, width: int, breaks: str = PATH_BREAKS) -> list[str]:
    """``text`` as lines of at most ``width`` cells where it can be: broken at spaces,
    and a word wider than ``width`` started on a line of its own and broken after its
    ``breaks``; a piece still wider is left whole for the caller to fold."""
    lines: list[str] = []
    for given in text.split("\n"):
        lines.extend(_lines(given.split(), max(width, 1), breaks))
    return lines


def _lines(words: list[str], width: int, breaks: str) -> Iterator[str]:
    line = ""
    for word in words:
        joined = f"{line} {word}" if line else word
        if cell_len(joined) <= width:
            line = joined
            continue
        if line:
            yield line
            line = ""
        if cell_len(word) <= width:
            line = word
            continue
        for piece in _pieces(word, breaks):
            if line and cell_len(line + piece) > width:
                yield line
                line = ""
            line += piece
    yield line


class Breakable:
    """Plain text in a table cell, wrapped by :func:`layout` at the column's width.

    ``style`` colours all of it; ``breaks`` are the characters after which a long
    word may break (:data:`PATH_BREAKS`, :data:`SLUG_BREAKS`).
    """

    def __init__(self, text: str, *, style: str = "", breaks: str = PATH_BREAKS) -> None:
        self.text = text
        self.style = style
        self.breaks = breaks

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        # The column is never made narrower than the widest piece when it can be helped.
        pieces = [p for w in self.text.split() for p in _pieces(w, self.breaks)]
        longest = max((cell_len(p) for p in pieces), default=0)
        widest = max((cell_len(line) for line in self.text.split("\n")), default=0)
        return Measurement(longest, widest).with_maximum(options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = layout(self.text, options.max_width, self.breaks)
        yield Text("\n".join(lines), style=self.style, overflow="fold")

    def __str__(self) -> str:
        return self.text


TIGHT_PADDING = (0, 1, 0, 0)
"""One space after each column, where the default two would fold a name."""


class FittedTable(Table):
    """A :class:`~rich.table.Table` that gives each column at least its cells' minimum
    width (their widest unbreakable piece: a :class:`Breakable`'s longest name, a
    no-wrap cell's whole text) whenever the width allows it all, taking the room
    from the columns that have more than their minimum.

    rich narrows the widest wrapping columns first, whatever they hold, and then folds
    the names in them; here that is the last resort. When even the minimums do not fit
    with two spaces between columns, the table tries one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._padding_asked = self.padding

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        self.padding = self._padding_asked  # the table may be printed again, wider
        yield from super().__rich_console__(console, options)

    def _calculate_column_widths(self, console: Console, options: ConsoleOptions) -> list[int]:
        limit = options.max_width
        if sum(self._minimums(console, options)) > limit and self.padding != TIGHT_PADDING:
            self.padding = TIGHT_PADDING
            if sum(self._minimums(console, options)) > limit:
                self.padding = self._padding_asked  # no help: rich folds as it would
        widths = super()._calculate_column_widths(console, options)
        return with_minimums(widths, self._minimums(console, options), limit)

    def _minimums(self, console: Console, options: ConsoleOptions) -> list[int]:
        return [self._measure_column(console, options, c).minimum for c in self.columns]


def with_minimums(widths: list[int], minimums: list[int], limit: int) -> list[int]:
    """``widths`` with each raised to its minimum, the room taken one cell at a time
    from the column with the most to spare; unchanged when the minimums add up to more
    than ``limit`` or the widths already hold them."""
    if sum(minimums) > limit or all(w >= m for w, m in zip(widths, minimums, strict=True)):
        return widths
    fitted = [max(w, m) for w, m in zip(widths, minimums, strict=True)]
    while sum(fitted) > limit:
        spare = [w - m for w, m in zip(fitted, minimums, strict=True)]
        fitted[spare.index(max(spare))] -= 1
    return fitted
