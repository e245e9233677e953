"""The daemon's stop order reaches the job as the market's notice would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spotd.agent.orders import OrdersWatcher
from spotd.agent.reporter import ReportRejected
from spotd.core.agent_wire import ProviderNotice
from spotd.core.clock import ManualClock
from spotd.core.orders import Orders, OrdersAsk, StopOrder, StopReason

T0 = datetime(2026, 6, 1, tzinfo=UTC)
SPEAKER = {"job_id": "j-1", "attempt": 2, "instance_id": "i-1", "provider": "sim-aws", "at": T0}


class Quiet:
    """A provider's watcher that has nothing to say, or a notice when told."""

    poll_interval = 0.1

    def __init__(self) -> None:
        self.notice: ProviderNotice | None = None

    def check(self) -> ProviderNotice | None:
        return self.notice

    def instance_id(self) -> str | None:
        return "i-1"

    def job_ended(self) -> None: ...

    def close(self) -> None: ...


def test_a_stop_order_is_a_preemption_notice_with_the_orders_deadline() -> None:
    asked: list[OrdersAsk] = []
    answer = Orders()

    def ask(what: OrdersAsk) -> Orders:
        asked.append(what)
        return answer

    clock = ManualClock(T0)
    watcher = OrdersWatcher(Quiet(), ask, every=30.0, clock=clock)
    assert watcher.check() is None and asked == []  # no instance id yet: nobody to ask for
    watcher.speaker = lambda: SPEAKER
    assert watcher.check() is None and len(asked) == 1
    assert asked[0].job_id == "j-1" and asked[0].attempt == 2
    answer = Orders(stop=StopOrder(reason=StopReason.PRIORITY, detail="a job takes its place",
                                   notice_seconds=120.0))  # fmt: skip
    assert watcher.check() is None and len(asked) == 1  # asked again only after 30 s
    clock.advance(30.0)
    notice = watcher.check()
    assert notice is not None and notice.kind == "preemption"
    assert notice.deadline == clock.now() + timedelta(seconds=120)
    assert "a job takes its place" in notice.detail
    clock.advance(60.0)
    assert watcher.check() == notice and len(asked) == 2  # said once, kept


def test_the_markets_own_notice_comes_first_and_a_refusing_daemon_means_no_orders() -> None:
    def refuse(what: OrdersAsk) -> Orders:
        raise ReportRejected("HTTP 404")

    inner = Quiet()
    clock = ManualClock(T0)
    watcher = OrdersWatcher(inner, refuse, every=1.0, speaker=lambda: SPEAKER, clock=clock)
    assert watcher.check() is None  # an older daemon: no orders, no failure
    inner.notice = ProviderNotice("preemption", T0 + timedelta(seconds=30), "reclaimed")
    assert watcher.check() == inner.notice
    assert watcher.instance_id() == "i-1"
