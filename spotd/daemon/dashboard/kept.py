"""Values kept by key and built again behind the answer once old.

What the dashboard shows that takes long to make (a pool's price chart, about
0.4 s of matplotlib; a window's cost report, a second or more) and that a page
asks for every few seconds is made once and then kept: an ask gets the value
kept at once, and one that finds it older than its freshness starts a new build
in a background thread, which a later ask gets. Only the first ask of a key
waits for a build, and :meth:`KeptBuilds.ready` not even that one.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from spotd.core.clock import WALL
from spotd.core.contracts import Clock

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class KeptBuilds(Generic[K, V]):
    """Up to ``max_items`` values by key, each built again behind the answer once
    ``fresh_seconds`` old: one build at a time, in one background thread, with at
    most ``max_pending`` due at once (the one running included; None: no bound).
    ``failure`` is the log line of a build that failed, ``%s`` standing for the key.
    ``then``, given, is called with a value built behind the answer once it is kept,
    in the same thread: work that can wait until the value is shown. Ages are
    ``clock``'s monotonic seconds."""

    def __init__(
        self,
        fresh_seconds: float,
        *,
        max_items: int,
        name: str,
        failure: str,
        max_pending: int | None = None,
        then: Callable[[V], object] | None = None,
        clock: Clock = WALL,
    ) -> None:
        self._fresh = fresh_seconds
        self._clock = clock
        self._then = then
        self._failure = failure
        self._max = max_items
        self._max_pending = max_pending
        self._kept: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._due: set[K] = set()
        self._lock = threading.Lock()
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def get(self, key: K, build: Callable[[], V]) -> V:
        """The value of ``key``: the one kept, else ``build()``'s (kept for later)."""
        kept = self._kept_or_due(key, build, start=False)
        return kept if kept is not None else self._keep(key, build())

    def ready(self, key: K, build: Callable[[], V]) -> V | None:
        """The value of ``key`` if one is kept, else None and its build started behind
        the answer (the caller asks again until it is there)."""
        return self._kept_or_due(key, build, start=True)

    def settled(self) -> Future[None]:
        """A future done once every build started so far has ended (for tests)."""
        return self._builder.submit(lambda: None)

    def _kept_or_due(self, key: K, build: Callable[[], V], *, start: bool) -> V | None:
        """The value kept, with a build behind the answer started where it is old (or,
        with ``start``, missing)."""
        with self._lock:
            kept = self._kept.get(key)
            if (kept is None and start) or (
                kept is not None and self._clock.monotonic() - kept[0] > self._fresh
            ):
                self._build_behind(key, build)
        return None if kept is None else kept[1]

    def _build_behind(self, key: K, build: Callable[[], V]) -> None:
        """Start a build of ``key`` unless one is due or too many are (the lock is held).

        A reader asking for one key after another cannot make the daemon build them
        all; a key turned away is built when it is asked for again.
        """
        full = self._max_pending is not None and len(self._due) >= self._max_pending
        if key not in self._due and not full:
            self._due.add(key)
            self._builder.submit(self._build, key, build)

    def _build(self, key: K, build: Callable[[], V]) -> None:
        try:
            value = self._keep(key, build())
            if self._then is not None:
                self._then(value)
        except Exception:
            # The old value stays; the next ask that finds it old tries again.
            log.exception(self._failure, key)
        finally:
            with self._lock:
                self._due.discard(key)

    def _keep(self, key: K, value: V) -> V:
        with self._lock:
            self._kept.pop(key, None)
            self._kept[key] = (self._clock.monotonic(), value)  # the newest last: dropped last
            while len(self._kept) > self._max:
                self._kept.popitem(last=False)
        return value
