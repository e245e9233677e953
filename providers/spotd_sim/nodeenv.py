"""The environment a simulated node's job starts with: a fresh machine's, not the daemon's.

A cloud VM's job sees what its image and boot script set, never the daemon's
own variables (cloud keys, the SMTP password, ``SPOTD_SECRET_*``). The
simulated VM runs on the daemon's machine, so it keeps only what any machine
would have (the PATH, the locale, the home folder, how the numeric libraries
must run here) and adds the job's own environment on top.
"""

from __future__ import annotations

from collections.abc import Mapping

BASE = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ",
                  "TMPDIR", "TERM", "VIRTUAL_ENV", "PYTHONPATH"})  # fmt: skip
BASE_PREFIXES = ("LC_", "OPENBLAS_", "OMP_", "MKL_")
"""The numeric libraries' settings of this machine (OpenBLAS needs its own on some CPUs)."""


def node_environment(host: Mapping[str, str], job: Mapping[str, str]) -> dict[str, str]:
    """What a node's job starts with: the machine basics of ``host``, then ``job``'s."""
    base = {k: v for k, v in host.items() if k in BASE or k.startswith(BASE_PREFIXES)}
    return {**base, **job}
