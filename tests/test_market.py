"""The market cache: polls, backoff, and what a failing provider leaves behind."""

from __future__ import annotations

from engine_support import FakeProvider

from spotd.market import MarketCache


class _Broken(FakeProvider):
    """An adapter with a bug: its poll raises an error it failed to map."""

    polls: int = 0

    def offerings(self) -> list:  # type: ignore[type-arg]
        self.polls += 1
        if self.polls > 1:
            raise KeyError("SpotPrice")
        return super().offerings()


def test_an_unmapped_error_in_a_poll_backs_off_and_keeps_the_last_offerings() -> None:
    broken = _Broken(name="broken")
    market = MarketCache({"broken": broken}, base_backoff_seconds=3600)
    first = market.refresh("broken")
    assert len(first.offerings) == 3 and first.failures == 0
    failed = market.refresh("broken")
    assert failed.failures == 1 and failed.error == "KeyError: 'SpotPrice'"
    assert failed.offerings == first.offerings, "the last good offerings are kept"
    assert market.refresh("broken") is failed, "backing off: no poll before retry_at"
    assert broken.polls == 2
