"""The market cache: polls, backoff, and what a failing provider leaves behind."""

from __future__ import annotations

from dataclasses import replace

from engine_support import FakeProvider

from spotd.market.cache import MarketCache


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


class _Growing(FakeProvider):
    """A provider whose second poll lists one more GPU model."""

    polls: int = 0

    def offerings(self) -> list:  # type: ignore[type-arg]
        self.polls += 1
        first = super().offerings()
        return first if self.polls == 1 else [*first, replace(first[0], gpu="H100")]


def test_the_offered_gpus_are_known_once_every_provider_answered_and_follow_the_polls() -> None:
    growing, silent = _Growing(name="growing"), FakeProvider(name="silent")
    market = MarketCache({"growing": growing, "silent": silent}, base_backoff_seconds=0)
    assert market.offered_gpus() is None  # nobody polled yet
    market.refresh("growing")
    assert market.offered_gpus() is None, "silent has not answered: nobody can tell"
    market.refresh("silent")
    assert market.offered_gpus() == {"A100"}
    market.refresh("growing")
    assert market.offered_gpus() == {"A100", "H100"}
