"""The on-VM agent: runs the job, watches the provider's preemption notice, reports to the daemon.

Start it as ``python -m spotd.agent -- COMMAND [ARG...]`` with ``SPOTD_AGENT_*``
variables set (see ``docs/agent.md``), or call :func:`main` / :func:`run_agent`.
"""

from spotd.agent.config import AgentConfig
from spotd.agent.runner import main, run_agent
from spotd.core.agent_wire import ProviderNotice
from spotd.core.contracts import NoticeWatcher

__all__ = ["AgentConfig", "NoticeWatcher", "ProviderNotice", "main", "run_agent"]
