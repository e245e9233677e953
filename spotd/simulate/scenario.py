"""Scenario files: which traces form the market, as which offerings, and which jobs to replay.

A scenario is a TOML file (format in ``docs/benchmarks.md``) validated with
pydantic; every problem raises :class:`ScenarioError` naming the file and the
dotted field. Trace paths stay relative here; :mod:`spotd.simulate.timeline`
resolves them against ``--traces`` / ``SPOTD_TRACES``, ``traces_root`` or the
scenario's folder.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spotd.core.errors import SpotdError
from spotd.core.network import Fabric

__all__ = [
    "DEFAULT_CHANGEOVER_HOURS",
    "DEFAULT_ON_DEMAND_RATIO",
    "CostModel",
    "JobEntry",
    "OfferingEntry",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_scenario",
    "scenario_from_traces",
]

DEFAULT_ON_DEMAND_RATIO = 3.06 / 0.918
"""k of the reference setting: p3.2xlarge on-demand over spot price (NSDI 2024 paper)."""
DEFAULT_CHANGEOVER_HOURS = 0.3
"""d of the reference setting: boot, setup and lost progress per new start (paper: 0.2-0.3 h)."""

Positive = Annotated[float, Gt(0)]
NonNegative = Annotated[float, Ge(0)]


class ScenarioError(SpotdError):
    """A scenario file is unreadable or invalid; the message names the file and field."""

    bad_input = True

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        detail = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: invalid scenario\n{detail}")


class CostModel(StrEnum):
    """How the simulator charges a run."""

    REFERENCE = "reference"
    """The paper's: spot 1 per instance-hour, on-demand k, changeover d, nothing else."""
    FULL = "full"
    """Each offering's prices, interconnect efficiency, checkpoint loss and egress."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OfferingEntry(_Model):
    """One trace file as one offering (an instance type in one zone of one provider)."""

    trace: str
    """Trace file, relative to the traces root (or absolute)."""
    provider: str
    region: str
    zone: str
    instance_type: str
    name: str | None = None
    """Short label in tables; defaults to the zone."""
    gpu: str | None = None
    """GPU model; defaults to the interconnect catalog's entry for the instance type."""
    gpus_per_node: Annotated[int, Ge(1)] | None = None
    gpu_memory_gb: Annotated[int, Ge(1)] | None = None
    fabric: Fabric | None = None
    gbps_per_gpu: Positive | None = None
    spot_price: Positive | None = None
    """USD per node-hour; required by the full cost model."""
    on_demand_price: Positive | None = None
    efficiency: Annotated[float, Gt(0), Le(1)] | None = None
    """Share of peak throughput a multi-node job gets here; defaults from the fabric."""
    notice_seconds: Annotated[int, Ge(0)] | None = None
    """Seconds of preemption notice; defaults to the provider's (AWS 120, GCP and Azure 30)."""

    @property
    def label(self) -> str:
        """The name used in tables and plots."""
        return self.name or self.zone


class JobEntry(_Model):
    """A job to replay from many start points along the trace."""

    name: str
    compute_hours: Positive
    deadline_hours: Positive | None = None
    """Deadline after the start, in hours; or give ``deadline_fraction``."""
    deadline_fraction: Annotated[float, Gt(0), Le(1)] | None = None
    """compute_hours / deadline_hours, the paper's way to state a deadline."""
    nodes: Annotated[int, Ge(1)] = 1
    gpus_per_node: Annotated[int, Ge(1)] | None = None
    """Defaults to the home offering's."""
    model_size_b: Positive | None = None
    min_gbps_per_gpu: Positive | None = None
    changeover_hours: NonNegative = DEFAULT_CHANGEOVER_HOURS
    checkpoint_gb: NonNegative = 0.0
    checkpoint_interval_hours: Positive = 1.0
    """Full model: progress since the last checkpoint is lost on a preemption."""
    checkpoint_on_notice: bool = Field(default=True, strict=True)
    """Full model: the job checkpoints on the preemption notice, so where that write fits
    in the offering's notice a preemption loses nothing."""
    starts: Annotated[int, Ge(1)] = 100
    seed: int = 0

    @model_validator(mode="after")
    def _one_deadline(self) -> JobEntry:
        if (self.deadline_hours is None) == (self.deadline_fraction is None):
            raise ValueError("give exactly one of deadline_hours and deadline_fraction")
        if self.window_hours < self.compute_hours:
            raise ValueError(
                f"deadline {self.window_hours:g} h is shorter than compute_hours "
                f"{self.compute_hours:g} h"
            )
        return self

    @property
    def window_hours(self) -> float:
        """Hours from the start to the deadline."""
        if self.deadline_hours is not None:
            return self.deadline_hours
        assert self.deadline_fraction is not None
        return self.compute_hours / self.deadline_fraction


class Scenario(_Model):
    """A whole scenario: market, cost model and jobs."""

    name: str
    description: str = ""
    traces_root: str | None = None
    """Folder trace paths are relative to, itself relative to the scenario's folder."""
    tick_seconds: Positive | None = None
    """Resample to this tick (available only if every sample in it is); None keeps the trace's."""
    cost_model: CostModel = CostModel.REFERENCE
    on_demand_ratio: Annotated[float, Gt(1)] = DEFAULT_ON_DEMAND_RATIO
    """k of the reference model (spot costs 1 per instance-hour)."""
    progress_quantum: Annotated[float, Gt(0), Le(1)] = 0.05
    """Full model: efficiencies are rounded to multiples of this for the exact DP."""
    home: str | None = None
    """Offering (by name) of the one-zone baselines; defaults to the first."""
    egress_usd_per_gb: dict[str, NonNegative] = Field(default_factory=dict)
    """Per provider: what moving a checkpoint out of it costs (full model)."""
    offerings: list[OfferingEntry]
    jobs: list[JobEntry]

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if not self.offerings:
            raise ValueError("offerings: list at least one [[offerings]] table")
        if not self.jobs:
            raise ValueError("jobs: list at least one [[jobs]] table")
        labels = [o.label for o in self.offerings]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"offerings: names must be unique, repeated: {', '.join(dup)}")
        if self.home is not None and self.home not in labels:
            raise ValueError(f"home: {self.home!r} is none of the offerings ({', '.join(labels)})")
        if self.cost_model is CostModel.FULL:
            for i, off in enumerate(self.offerings):
                if off.spot_price is None or off.on_demand_price is None:
                    raise ValueError(
                        f"offerings[{i}] ({off.label}): the full cost model needs "
                        "spot_price and on_demand_price"
                    )
        return self

    @property
    def home_index(self) -> int:
        """Index of the home offering."""
        if self.home is None:
            return 0
        return [o.label for o in self.offerings].index(self.home)


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not item.startswith(("function-", "constrained-", "lax-", "tagged-")):
            parts.append(f".{item}" if parts else item)
    return "".join(parts) or "(top level)"


def parse_scenario(data: dict[str, Any], *, source: str) -> Scenario:
    """Validate already-parsed TOML; raise :class:`ScenarioError` naming each bad field."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            msg = e["msg"].removeprefix("Value error, ")
            where = _field_path(tuple(e["loc"]))
            if e["type"] == "extra_forbidden":
                msg = "unknown field"
            problems.append(f"{where}: {msg}")
        raise ScenarioError(source, problems) from None


def load_scenario(path: Path) -> Scenario:
    """Read and validate the scenario file at ``path``."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(source, [f"cannot read the file: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, [f"not UTF-8 text ({exc})"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, [f"not valid TOML: {exc}"]) from None
    return parse_scenario(data, source=source)


TRACES_SOURCE = "--trace"
"""What errors name as the source of a scenario made from trace files alone."""


def scenario_from_traces(
    paths: Sequence[Path],
    *,
    compute_hours: float | None = None,
    deadline_fraction: float | None = None,
    nodes: int | None = None,
    tick_seconds: float | None = None,
) -> Scenario:
    """A reference-model scenario of trace files (or folders of them) named on the
    command line.

    Each file is one offering of an anonymous provider, named after the file;
    a folder stands for its ``*.json`` files. The job is the paper's setting
    where not given (48 h of compute, deadline fraction 0.8, one node, 100
    start points, seed 0; the traces' own tick). The files must share a
    timeline, as the files of one trace folder do.
    """
    compute_hours = 48.0 if compute_hours is None else compute_hours
    deadline_fraction = 0.8 if deadline_fraction is None else deadline_fraction
    nodes = 1 if nodes is None else nodes
    paths = _trace_files(paths)
    stems = [p.stem for p in paths]
    names = [
        stem if stems.count(stem) == 1 else f"{p.parent.name}/{stem}"
        for p, stem in zip(paths, stems, strict=True)
    ]
    data: dict[str, Any] = {
        "name": _run_name(paths),
        "description": "trace files given on the command line, reference cost model",
        "cost_model": CostModel.REFERENCE.value,
        "offerings": [
            # The reference fabric: the reference model runs every offering at full
            # speed, and so the policies' estimates should.
            {"trace": str(p.resolve()), "name": name, "provider": "trace",
             "region": "trace", "zone": name, "instance_type": "trace",
             "fabric": Fabric.INFINIBAND.value, "gbps_per_gpu": 400}
            for p, name in zip(paths, names, strict=True)
        ],
        "jobs": [{
            "name": f"c{compute_hours:g}-f{deadline_fraction:g}"
            + (f"-{nodes}node" if nodes > 1 else ""),
            "compute_hours": compute_hours,
            "deadline_fraction": deadline_fraction,
            "nodes": nodes,
        }],
    }  # fmt: skip
    if tick_seconds is not None:
        data["tick_seconds"] = tick_seconds
    return parse_scenario(data, source=TRACES_SOURCE)


def _run_name(paths: Sequence[Path]) -> str:
    """The file's name, or the folder's when all come from one: it names the plots, so
    two runs on other traces do not overwrite each other's."""
    if len(paths) == 1:
        return paths[0].stem
    folders = {p.parent for p in paths}
    return folders.pop().name if len(folders) == 1 else "traces"


def _trace_files(given: Sequence[Path]) -> list[Path]:
    """The files named, with each folder replaced by its ``*.json`` files."""
    files: list[Path] = []
    for path in given:
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if not found:
                raise ScenarioError(TRACES_SOURCE, [f"{path}: a folder with no .json files"])
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ScenarioError(TRACES_SOURCE, [f"{path}: no such file or folder"])
    if not files:
        raise ScenarioError(TRACES_SOURCE, ["name at least one trace file"])
    return files
