"""The daemon's answer to a gang node standing by after its command (:mod:`spotd.core.rejoin`).

The answer is what the store holds (:func:`spotd.engine.repair.next_step`): the
job's open attempt keeps the node (``rejoin``, with that attempt's agent token
and environment), the loop has not decided yet (``wait``), or the job goes on
without it (``leave``). The ask is also the node's heartbeat for the attempt it
names, which tells the loop that the node stands by. Any daemon on the database
answers alike, so the node may ask whichever it reaches.
"""

from __future__ import annotations

from spotd.core.agent_wire import agent_token
from spotd.core.contracts import Store
from spotd.core.rejoin import RejoinAnswer, RejoinAsk, RejoinStep
from spotd.core.values import InstanceReport
from spotd.engine.launching import attempt_environment
from spotd.engine.repair import next_step

__all__ = ["DaemonRejoin"]


class DaemonRejoin:
    """Answers from the store; speaks the new attempt's agent token from ``daemon_token``."""

    def __init__(self, store: Store, daemon_token: str) -> None:
        self._store = store
        self._token = daemon_token

    def next_step(self, ask: RejoinAsk) -> RejoinAnswer:
        """Note that the node stands by, then what it is to do (see the module)."""
        self._store.save_report(
            InstanceReport(ask.instance_id, ask.provider, ask.job_id, ask.attempt,
                           heartbeat_at=ask.at)
        )  # fmt: skip
        job = self._store.get_job(ask.job_id)
        step, attempt = next_step(job.status, self._store.attempts(ask.job_id), ask.attempt,
                                  ask.instance_id)  # fmt: skip
        if step is not RejoinStep.REJOIN or attempt is None:
            return RejoinAnswer(step=step)
        return RejoinAnswer(step=step, attempt=attempt.seq,
                            token=agent_token(self._token, attempt.client_token),
                            env=attempt_environment(attempt))  # fmt: skip
