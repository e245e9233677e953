"""The daemon log's levels: spotd's own lines at INFO (DEBUG with ``--verbose``), the
libraries' chatter left out.

The libraries below log at INFO (some at every request or every chart) what an
operator never acts on: matplotlib's font cache and unit guesses under the
reports' charts, the HTTP clients' one line per request, the cloud SDKs' found
credentials and retried calls. Their warnings and errors still reach the log.
"""

from __future__ import annotations

import logging

__all__ = ["LIBRARY_LOGGERS", "configure_daemon_log", "quiet_library_logs"]

LIBRARY_LOGGERS = (
    "matplotlib", "PIL", "fontTools",
    "httpx", "httpcore", "urllib3", "requests", "multipart", "python_multipart",
    "fsspec", "filelock",
)  # fmt: skip
"""Loggers of third-party libraries kept at WARNING in the daemon's log, each with
the loggers under it (``matplotlib.font_manager``); the provider kinds name their
SDKs' own (``ProviderKind.sdk_loggers``)."""


def quiet_library_logs() -> None:
    """Keep :data:`LIBRARY_LOGGERS` at WARNING, ``--verbose`` or not: DEBUG from them
    (matplotlib's font scoring, every HTTP header) would bury the scheduler's own."""
    from spotd.registry import provider_kinds

    sdks = [name for kind in provider_kinds() for name in kind.sdk_loggers]
    for name in (*LIBRARY_LOGGERS, *sdks):
        logging.getLogger(name).setLevel(logging.WARNING)


def configure_daemon_log(verbose: bool = False) -> None:
    """The daemon's log on stderr: ``time level logger: message``, at INFO, or DEBUG
    with ``verbose``; APScheduler's per-run lines and the libraries' chatter left out."""
    from spotd.daemon.logtimes import LOG_FORMAT
    from spotd.daemon.process import quiet_scheduler_log

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=LOG_FORMAT)
    quiet_scheduler_log(verbose)
    quiet_library_logs()
