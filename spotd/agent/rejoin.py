"""After its command ends, a gang node's agent stands by for the job's next attempt.

When some nodes of a running gang go and the others are healthy, the daemon may
keep those for the next attempt and launch new nodes for the lost ranks only
(:mod:`spotd.core.rejoin`). So once the command of a multi-node attempt has
exited (or its preflight failed on another node, which the daemon replaces
alone) and its exit is reported, the agent of a node that had no notice of its
own does not end at once: it asks the daemon what next, every
``SPOTD_AGENT_JOIN_POLL_SECONDS``, for at most ``SPOTD_AGENT_REJOIN_WAIT_SECONDS``.

- ``rejoin``: the agent runs again as the node of the new attempt, speaking with
  that attempt's token, the job's environment updated with what the daemon says
  changed (its attempt, rendezvous id, checkpoint to resume from): it joins the
  new gang, passes its preflight and runs the command, whose code is already on
  the node, resuming from the last complete checkpoint like any resumed node.
- ``leave``, a refusal (an old daemon's 404), the wait running out or a signal
  to the agent: it ends as it always did (and runs ``on_exit`` then).

Meanwhile the node is billed; the daemon decides within a pass or two of the
node's first ask, which is its heartbeat (:mod:`spotd.engine.repair`).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pydantic import SecretStr

from spotd.agent.config import AgentConfig
from spotd.agent.files import NOTICE_FILE, PROGRESS_FILE
from spotd.agent.output import OUTPUT_FILE
from spotd.agent.reporter import ReportFailed, ReportRejected
from spotd.core.agent_wire import ExitPhase
from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.handlers import on_stop_signals
from spotd.core.ranks import RANK_FILE_GLOB
from spotd.core.rejoin import RejoinAnswer, RejoinAsk, RejoinStep

log = logging.getLogger(__name__)

AskNext = Callable[[RejoinAsk], RejoinAnswer]
"""One ask of the daemon (raises ReportFailed or ReportRejected)."""

_RUN_FILES = (OUTPUT_FILE, PROGRESS_FILE, NOTICE_FILE, "hostfile")
"""What a run leaves in a configured run folder that the next run must not find."""


def stands_by(
    config: AgentConfig, *, phase: ExitPhase, noticed: bool, stopped: bool,
    peer_at_fault: bool = False,
) -> bool:  # fmt: skip
    """Whether the node stands by after its run: a node of a gang of several, on a provider
    that can add a node to a running gang (``ProviderKind.replaces_gang_nodes``), reporting
    to a daemon, whose command ran and ended (or whose preflight failed on another node,
    ``peer_at_fault``) with no notice on this node and no signal to the agent (a node that
    is going never stands by)."""
    try:
        nodes = int(config.job_env.get("SPOTD_NUM_NODES", "") or 1)
    except ValueError:
        return False
    kind = config.kind
    return (
        kind is not None and kind.replaces_gang_nodes
        and bool(config.daemon_url) and config.rejoin_wait_seconds > 0 and nodes > 1
        and (phase == "command" or (phase == "preflight" and peer_at_fault))
        and not noticed and not stopped
    )  # fmt: skip


def stand_by(
    config: AgentConfig, ask: AskNext, *, stop: threading.Event, clock: Clock = WALL
) -> AgentConfig | None:
    """Ask what next until the daemon says (see the module); the configuration of the
    next run, or None when the agent is to leave. ``config`` is the ended run's, with
    its instance id resolved."""
    deadline = clock.monotonic() + config.rejoin_wait_seconds
    log.info("standing by for the job's next attempt (at most %g s)", config.rejoin_wait_seconds)
    while not stop.is_set():
        answer = _asked(config, ask, clock)
        if isinstance(answer, RejoinAnswer):
            if answer.step is RejoinStep.REJOIN and answer.attempt is not None and answer.token:
                log.info("rejoining the job as a node of attempt %d", answer.attempt)
                return rejoined(config, answer)
            if answer.step is RejoinStep.LEAVE:
                log.info("the job goes on without this node: leaving")
                return None
        elif answer is False:
            return None
        left = deadline - clock.monotonic()
        if left <= 0:
            log.warning("no next attempt within %g s: leaving", config.rejoin_wait_seconds)
            return None
        stop.wait(min(config.join_poll_seconds, left))
    return None


def _asked(config: AgentConfig, ask: AskNext, clock: Clock) -> RejoinAnswer | bool:
    """The daemon's answer; True: none now (ask again); False: refused (leave)."""
    try:
        return ask(RejoinAsk.model_validate(config.speaker(config.instance_id, clock)))
    except ReportRejected as exc:
        # A daemon too old for the route (404), or one that no longer knows the job.
        log.info("the daemon does not keep this node: leaving (%s)", exc)
        return False
    except ReportFailed as exc:
        log.warning("asking what next failed, will retry: %s", exc)
        return True


def rejoined(config: AgentConfig, answer: RejoinAnswer) -> AgentConfig:
    """``config`` for the run as a node of the answer's attempt."""
    assert answer.attempt is not None
    env = {**config.job_env, **answer.env, "SPOTD_AGENT_ATTEMPT": str(answer.attempt)}
    return config.model_copy(
        update={"attempt": answer.attempt, "token": SecretStr(answer.token), "job_env": env}
    )


def clear_run_dir(config: AgentConfig) -> None:
    """Remove what the ended run left in a configured run folder (its output, progress,
    its ranks' progress, notice and hostfile): the next run starts afresh. A temporary
    one is gone already."""
    if not config.run_dir:
        return
    folder = Path(config.run_dir)
    for path in [*(folder / n for n in _RUN_FILES), *folder.glob(RANK_FILE_GLOB)]:
        with suppress(OSError):
            path.unlink(missing_ok=True)


@contextmanager
def stopping_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGTERM or SIGINT to the agent while it stands by (the node is
    going)."""

    def leave(sig: signal.Signals) -> None:
        log.info("agent got %s while standing by: leaving", sig.name)
        stop.set()

    with on_stop_signals(leave):
        yield
