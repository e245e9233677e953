"""How large each field of a job spec may be, and why: every figure once.

Each bound leaves a real job room to spare, and is small enough that nothing
spotd computes from the field overflows and nothing it hands the operating
system is refused. :mod:`spotd.core.spec` checks them on every spec that is
submitted (a job file, a ``POST /v1/jobs`` body, a spec built in Python), not
on one read back from the store, which may predate them;
``docs/job-spec.md`` states them.

What a node execs: Linux refuses one string of ``argv`` or of the environment
over 128 KiB (``MAX_ARG_STRLEN``) and all of them together over a quarter of
the stack limit (``ARG_MAX``: 2 MiB with the usual 8 MiB stack) with "Argument
list too long". A spec within these bounds adds at most the command
(:data:`MAX_COMMAND_BYTES`), ``[env]`` (:data:`MAX_ENV_BYTES`) and one
``[fabric_env]`` table (:data:`MAX_FABRIC_ENV_BYTES`), 448 KiB, and no string of
it is much over a quarter of ``MAX_ARG_STRLEN``: spotd's own variables and the
node's environment keep well over 1 MiB.

Times: every duration is at most :data:`MAX_DURATION`, so a time a year or
so from now, or from any launch, is a ``datetime`` (year 9999 at most).
"""

from __future__ import annotations

from datetime import timedelta

__all__ = [
    "MAX_ARG_BYTES",
    "MAX_BUDGET_USD",
    "MAX_BUSBW_GBPS",
    "MAX_CHECKPOINT_GB",
    "MAX_CODE_BYTES",
    "MAX_CODE_FILES",
    "MAX_COMMAND_ARGS",
    "MAX_COMMAND_BYTES",
    "MAX_COMPUTE_HOURS",
    "MAX_DURATION",
    "MAX_EMAILS",
    "MAX_EMAIL_CHARS",
    "MAX_ENV_BYTES",
    "MAX_ENV_NAME_CHARS",
    "MAX_ENV_VARS",
    "MAX_EXIT_CODES",
    "MAX_FABRIC_ENV_BYTES",
    "MAX_GBPS_PER_GPU",
    "MAX_GPUS_PER_NODE",
    "MAX_GPU_MODELS",
    "MAX_GPU_NAME_CHARS",
    "MAX_IMAGE_CHARS",
    "MAX_MODEL_SIZE_B",
    "MAX_NODES",
    "MAX_PATH_BYTES",
    "MAX_PATTERNS",
    "MAX_PATTERN_CHARS",
    "MAX_PRICE_PER_GPU_HOUR",
    "MAX_RUN_HOURS",
    "MAX_SETUP_LINES",
    "MIN_CHECKPOINT_GB",
]

# -- resources ---------------------------------------------------------------

MAX_NODES = 4096
"""Nodes of one job. The largest training runs published use about 2,000 nodes of
8 GPUs (16,384 H100); twice that still fits, and a number no market can fill is
refused rather than left waiting for ever."""

MAX_GPUS_PER_NODE = 16
"""GPUs of one node: the most any instance type offers."""

MAX_GPU_MODELS = 64
"""GPU models one job lists: every model there is, several times over."""

MAX_GPU_NAME_CHARS = 63
"""Characters of one GPU model name (``H100``, ``A100-80GB``), as for a job's name."""

MAX_MODEL_SIZE_B = 100_000.0
"""Billions of parameters (100 trillion): fifty times the largest models published
(about 2 trillion)."""

MAX_GBPS_PER_GPU = 10_000.0
"""Scale-out Gbit/s per GPU (10 Tbit/s): over ten times the fastest NIC per GPU (800G)."""

MAX_BUSBW_GBPS = 10_000.0
"""``preflight.min_busbw_gbps``, GB/s of all-reduce bus bandwidth (10 TB/s): over ten
times what an all-reduce reaches even inside one NVLink domain (under 1 TB/s)."""

# -- market --------------------------------------------------------------------

MAX_PATTERNS = 64
"""Patterns in ``market.providers`` or ``market.regions``: more than there are clouds'
regions to tell apart by hand."""

MAX_PATTERN_CHARS = 255
"""Characters of one provider or region pattern; region names run to about 30."""

MAX_PRICE_PER_GPU_HOUR = 1_000.0
"""USD per GPU-hour a job may accept: a hundred times the dearest on-demand GPU.
A job that wants no price limit leaves the key out."""

MAX_RUN_HOURS = 120 * 24.0
"""The longest ``max_run_hours`` (GCP's limit on a maximum run duration: 120 days)."""

# -- time ----------------------------------------------------------------------

MAX_DURATION = timedelta(days=366)
"""The longest duration a spec states (``checkpoint.interval``, ``gang.timeout``,
``preflight.timeout``): a year, leap day included. No job checkpoints or waits for
its gang less often than that, and a launch or "now" plus it stays a ``datetime``
(a ``"99999999h"`` did not: eleven thousand years)."""

MAX_COMPUTE_HOURS = MAX_DURATION.total_seconds() / 3600
"""``deadline.compute_hours`` (8784 h): the same year, in the unit the key is in."""

# -- checkpoints and money -----------------------------------------------------

MAX_CHECKPOINT_GB = 1_000_000.0
"""GB of one checkpoint (1 PB): thirty times the weights and optimizer state of a
2-trillion-parameter model (16 bytes a parameter). It prices the time to write and
read a checkpoint, which stays a finite number of hours (a ``1e308`` did not)."""

MIN_CHECKPOINT_GB = 1e-6
"""The least GB of one checkpoint (a kilobyte): no checkpoint is smaller, and below
some 1e-320 GB the time to write one underflows to zero hours, which leaves Young's
checkpoint interval zero and the policies' cost model dividing by it."""

MAX_BUDGET_USD = 1_000_000_000.0
"""USD one job may spend over all its attempts (a billion): more than the compute of
any training run reported so far has cost."""

# -- what the nodes exec -------------------------------------------------------

MAX_ARG_BYTES = 32 * 1024
"""UTF-8 bytes of one string the node execs or sources: an item of ``command``, an
``[env]`` or ``[fabric_env]`` value, a ``setup`` line. A quarter of Linux's
``MAX_ARG_STRLEN`` (128 KiB), with the variable's name beside it."""

MAX_COMMAND_ARGS = 4096
"""Items of ``command``: a torchrun line with every flag has a few dozen."""

MAX_COMMAND_BYTES = 128 * 1024
"""UTF-8 bytes of ``command`` in all (each item with its NUL, as exec counts it)."""

MAX_ENV_VARS = 1024
"""Variables in ``[env]`` or one ``[fabric_env]`` table, and names in ``secrets``."""

MAX_ENV_NAME_CHARS = 255
"""Characters of a variable's name; real ones (``NCCL_GPUDIRECTTCPX_SOCKET_IFNAME``)
have about 30."""

MAX_ENV_BYTES = 256 * 1024
"""UTF-8 bytes of ``[env]`` in all, each variable counted as exec counts it
(``NAME=value`` and a NUL): an eighth of ``ARG_MAX``. Larger data goes in a file
in the code or a checkpoint, not in the environment."""

MAX_FABRIC_ENV_BYTES = 64 * 1024
"""UTF-8 bytes of one ``[fabric_env]`` table in all (counted as :data:`MAX_ENV_BYTES`):
NCCL and libfabric settings are short; only one table applies to a launch."""

MAX_SETUP_LINES = 256
"""Lines of ``setup``, each run by its own ``bash -c``."""

MAX_PATH_BYTES = 4095
"""UTF-8 bytes of ``workdir``, ``checkpoint.uri`` and ``code.uri``: Linux's
``PATH_MAX`` (4096) less its NUL, and over three times the longest object key
S3, GCS or Azure Blob allow (1024)."""

MAX_IMAGE_CHARS = 512
"""Characters of ``image``: a 255-character repository name (the OCI distribution
limit), a 128-character tag and a sha256 digest fit."""

MAX_EXIT_CODES = 511
"""Codes in ``retry.restart_on_exit_codes``: each of -255 to 255 once."""

# -- the rest ------------------------------------------------------------------

MAX_EMAILS = 64
"""Addresses in ``notify.email``: a list or alias serves a whole team in one."""

MAX_EMAIL_CHARS = 254
"""Characters of one address: the longest path SMTP carries (RFC 5321)."""

MAX_CODE_BYTES = 2**40
"""Bytes of a shipped ``code`` archive (1 TiB). ``spotd submit`` sets it, holding the
archive in memory; the daemon's ``max_workdir_mb`` is far smaller by default."""

MAX_CODE_FILES = 100_000_000
"""Files in a shipped ``code`` archive (set by ``spotd submit``)."""
