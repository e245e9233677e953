"""The environment a simulated node's job starts with: a fresh machine's, not the daemon's.

A cloud VM's job sees what its image and boot script set, never the daemon's
own variables (cloud keys, the SMTP password, ``SPOTD_SECRET_*``). The
simulated VM runs on the daemon's machine, so it keeps only what any machine
would have (the PATH, the locale, the home folder, how the numeric libraries
must run here) and adds the job's own environment on top. Its PATH starts
with the folder of the Python that runs the simulated VM, as a cloud image
puts its own Python first: a job's ``python3`` is then one that has spotd,
whether or not the shell that started the daemon had its virtual environment
active.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

BASE = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ",
                  "TMPDIR", "TERM", "VIRTUAL_ENV", "PYTHONPATH"})  # fmt: skip
BASE_PREFIXES = ("LC_", "OPENBLAS_", "OMP_", "MKL_")
"""The numeric libraries' settings of this machine (OpenBLAS needs its own on some CPUs)."""


def node_environment(
    host: Mapping[str, str], job: Mapping[str, str], *, image_bin: str | None = None
) -> dict[str, str]:
    """What a node's job starts with: the machine basics of ``host``, with
    ``image_bin`` (the image's own programs) first on the PATH, then ``job``'s."""
    base = {k: v for k, v in host.items() if k in BASE or k.startswith(BASE_PREFIXES)}
    if image_bin is not None:
        rest = [d for d in base.get("PATH", os.defpath).split(os.pathsep) if d and d != image_bin]
        base["PATH"] = os.pathsep.join([image_bin, *rest])
    return {**base, **job}
