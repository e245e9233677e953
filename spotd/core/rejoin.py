"""A gang node whose command ended asks the daemon what next: wait, rejoin, or leave.

When some nodes of a running gang go (preempted, lost) while the others are
healthy, the daemon may keep those and launch new nodes for the lost ranks only
(:mod:`spotd.engine.repair`). For that the healthy nodes' agents must outlive
their command: once the command of a multi-node attempt has exited and its exit
is reported, the agent *stands by* and asks (``POST /v1/agent/next``, a
:class:`RejoinAsk` for the attempt it ran) until the daemon answers
:class:`RejoinAnswer`:

- ``wait``: the daemon has not decided yet (or the next attempt's launch is
  not recorded yet); ask again.
- ``rejoin``: the job's next attempt keeps this node. The answer carries that
  attempt's number, the agent token to speak for it, and what changes in the
  job's environment (:func:`spotd.engine.launching.attempt_environment`); the
  agent joins the new gang, passes its preflight and runs the command again,
  resuming from the last complete checkpoint as any resumed node does.
- ``leave``: the job goes on without this node (or ended); the agent exits
  as it always did.

Each ask counts as the node's heartbeat for the attempt it names: that is how
the engine knows the node stands by. An agent with no daemon, or a daemon too
old for the route (404), leaves; so does one that waited longer than its
``SPOTD_AGENT_REJOIN_WAIT_SECONDS``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from spotd.core.agent_wire import AgentReport

__all__ = ["REJOIN_PATH", "AgentRejoin", "RejoinAnswer", "RejoinAsk", "RejoinStep"]

REJOIN_PATH = "/v1/agent/next"


class RejoinStep(StrEnum):
    """What a standing-by node is to do next."""

    WAIT = "wait"
    """Ask again: the daemon has not decided, or the next attempt is not launched yet."""
    REJOIN = "rejoin"
    """Run the job again as a node of the next attempt (the answer says which)."""
    LEAVE = "leave"
    """The job goes on without this node, or is over: the agent ends."""


class RejoinAsk(AgentReport):
    """A node whose command exited asks what next (its heartbeat while it stands by)."""


class RejoinAnswer(BaseModel):
    """The daemon's answer to a :class:`RejoinAsk`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    step: RejoinStep
    attempt: int | None = None
    """The attempt to rejoin (``rejoin`` only)."""
    token: str = Field(default="", repr=False)
    """The agent token of that attempt (``rejoin`` only): the node speaks for it from now."""
    env: dict[str, str] = Field(default_factory=dict)
    """What the job's environment says differently in that attempt (``rejoin`` only)."""


class AgentRejoin(Protocol):
    """Where the agent route for the next step asks (thread-safe: called from worker
    threads)."""

    def next_step(self, ask: RejoinAsk) -> RejoinAnswer:
        """What the node of ``ask`` is to do now."""
        ...
