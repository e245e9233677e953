"""The node's output: one file the job, its setup lines and the agent's own lines
write to, which the agent ships to the daemon (:mod:`spotd.agent.logship`).

With a daemon to ship to, the job's stdout and stderr go to ``output.log`` in the
run folder (opened for appending, so its writers' lines never overwrite each
other), and so do the setup lines' output and the agent's log lines while the file
is open. What comes is also copied (*echoed*) to the agent's own stdout, so the
node's log (``/var/log/spotd-agent.log`` on a cloud, ``<id>.log`` of a simulated
node) still holds everything, as it did when the job wrote there itself.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from spotd.core.agent_wire import MAX_LOG_CHUNK

OUTPUT_FILE = "output.log"

Echo = Callable[[bytes], None]
"""Where the node's output is copied to as it comes (the agent's stdout)."""


def to_stdout(data: bytes) -> None:
    """Write ``data`` to file descriptor 1 whole; a closed stdout drops it."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(1, view) :]
    except OSError:
        pass  # nobody reads the agent's stdout any more; the shipped copy is what counts


class NodeOutput:
    """The node's output file (see the module): appended to by its writers, read by
    offset by the shipper. Thread-safe."""

    def __init__(self, path: Path, *, echo: Echo | None = to_stdout) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()
        self._echo = echo
        self._size = os.fstat(self._fd).st_size
        # A file there already (a restarted agent's) went to the node's log before.
        self._echoed = self._size

    def fileno(self) -> int:
        """The file's descriptor, for a child's stdout and stderr."""
        return self._fd

    def write(self, data: bytes) -> None:
        """Append ``data`` whole; after :meth:`close` it is dropped."""
        with self._lock:
            if self._fd < 0:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]

    def size(self) -> int:
        """Bytes written so far, by every writer (the job's included)."""
        with self._lock:
            if self._fd >= 0:
                self._size = os.fstat(self._fd).st_size
            return self._size

    def read(self, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes from ``offset`` on (fewer at the end)."""
        with self.path.open("rb") as f:
            f.seek(offset)
            return f.read(limit)

    def echo_new(self) -> None:
        """Copy to the echo what was written since the last call."""
        if self._echo is None:
            return
        end = self.size()
        while self._echoed < end:
            data = self.read(self._echoed, MAX_LOG_CHUNK)
            if not data:
                break
            self._echo(data)
            self._echoed += len(data)

    def close(self) -> None:
        """Close the file for writing (reading goes on); idempotent."""
        with self._lock:
            if self._fd >= 0:
                self._size = os.fstat(self._fd).st_size
                os.close(self._fd)
                self._fd = -1


class AgentLines(logging.Handler):
    """The agent's own log lines: into the node's output while one is attached (so they
    are shipped with the job's, in the order they came), else to stderr.

    ``python -m spotd.agent`` logs through one; :func:`spotd.agent.run_agent`
    attaches its output to it for the job's run.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self._stream = stream
        self._output: NodeOutput | None = None

    def attach(self, output: NodeOutput | None) -> None:
        """Write into ``output`` from now on; None: to the stream again."""
        self._output = output

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
            output = self._output
            if output is not None:
                output.write(line.encode(errors="replace"))
                return
            stream = self._stream or sys.stderr  # read now: a test may have swapped it
            stream.write(line)
            stream.flush()
        except Exception:
            self.handleError(record)
