"""Drawings kept by what they show, drawn again behind the answer once old.

A chart that matplotlib takes a few hundred milliseconds to draw, asked for
every few seconds by a page, is drawn once and then kept: an ask gets the
drawing kept at once, and one that finds it older than its freshness starts a
new drawing in a background thread, which the next ask gets. Only the first
ask of a key waits for a drawing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class KeptDrawings(Generic[K]):
    """Up to ``max_items`` drawings by key, each redrawn behind the answer once
    ``fresh_seconds`` old (one redrawing at a time, in one background thread)."""

    def __init__(self, fresh_seconds: float, *, max_items: int, name: str) -> None:
        self._fresh = fresh_seconds
        self._max = max_items
        self._kept: OrderedDict[K, tuple[float, str]] = OrderedDict()
        self._due: set[K] = set()
        self._lock = threading.Lock()
        self._painter = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def get(self, key: K, draw: Callable[[], str]) -> str:
        """The drawing of ``key``: the one kept, else ``draw()``'s (kept for later)."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and time.monotonic() - kept[0] > self._fresh:
                self._redraw_behind(key, draw)
        if kept is not None:
            return kept[1]
        return self._keep(key, draw())

    def redrawn(self) -> Future[None]:
        """A future done once every redrawing asked for so far has ended (for tests)."""
        return self._painter.submit(lambda: None)

    def _redraw_behind(self, key: K, draw: Callable[[], str]) -> None:
        """Start a redrawing of ``key`` unless one is due (the lock is held)."""
        if key not in self._due:
            self._due.add(key)
            self._painter.submit(self._redraw, key, draw)

    def _redraw(self, key: K, draw: Callable[[], str]) -> None:
        try:
            self._keep(key, draw())
        except Exception:
            # The old drawing stays; the next ask that finds it old tries again.
            log.exception("the dashboard could not redraw %s", key)
        finally:
            with self._lock:
                self._due.discard(key)

    def _keep(self, key: K, drawing: str) -> str:
        with self._lock:
            self._kept.pop(key, None)
            self._kept[key] = (time.monotonic(), drawing)  # the newest last: dropped last
            while len(self._kept) > self._max:
                self._kept.popitem(last=False)
        return drawing
