"""Which checkpoint a run resumes from, agreed by every rank, and loading it.

``SPOTD_RESUME_FROM`` when set; otherwise the latest complete checkpoint under the
checkpoint URI (unless that search is off); otherwise a fresh start. A folder
without ``_COMPLETE`` is never loaded: an explicit one is an error, and the search
skips torn folders. Rank 0 alone looks and tells the others, so every rank loads
the same folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spotd import checkpoints as ck
from spotd.core.errors import CheckpointError
from spotd.train import dcp
from spotd.train.comm import Comm

__all__ = ["ResumeSource", "load_checkpoint"]


@dataclass(frozen=True)
class ResumeSource:
    """Where a run may resume from."""

    resume_from: str | None
    """An explicit checkpoint folder, or None."""
    latest: bool
    """Whether to look for the latest complete checkpoint under ``checkpoint_uri``."""
    checkpoint_uri: str | None

    def folder(self) -> str | None:
        """The folder to resume from, or None for a fresh start (looked up here alone)."""
        if self.resume_from is not None:
            if not ck.is_complete(self.resume_from):
                raise CheckpointError(
                    f"{self.resume_from}: no {ck.MARKER} marker; refusing to resume from a "
                    "checkpoint that was not completely written"
                )
            return self.resume_from
        if self.latest and self.checkpoint_uri is not None:
            latest = ck.latest_complete(self.checkpoint_uri)
            return None if latest is None else latest.uri
        return None

    def agreed_folder(self, comm: Comm) -> str | None:
        """Rank 0 picks the folder and every rank gets its choice (or its error)."""
        choice: str | None = None
        if comm.is_main:
            try:
                folder = self.folder()
                choice = "none:" if folder is None else f"ok:{folder}"
            except CheckpointError as exc:
                choice = f"error:{exc}"
        agreed = comm.broadcast(choice) or "none:"
        kind, _, value = agreed.partition(":")
        if kind == "error":
            raise CheckpointError(value)
        return value if kind == "ok" else None


def load_checkpoint(folder: str, state: Mapping[str, Any], comm: Comm) -> int:
    """Load ``folder`` into ``state`` in place on every rank; return its step."""
    payload: dict[str, Any] = {**state, dcp.STATE_KEY: {"step": -1}}
    dcp.load(payload, dcp.make_reader(folder), comm.ckpt_group)
    step = int(payload[dcp.STATE_KEY]["step"])
    if step < 0:
        raise CheckpointError(f"{folder}: no step recorded under {dcp.STATE_KEY!r}")
    return step
