"""What every notebook's plan is made of (the machine it meets, the runs it starts, the sizes it picks), and
`plan_for`, which finds a notebook's planner in its chapter's chNN_plan module."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Machine:
    """The shape a notebook meets: GPUs per node, the ranks per node its launches use, and nodes."""

    gpus: int
    nproc: int
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.nproc < 1 or self.nodes < 1:
            raise ValueError(
                f"expected gpus >= 0, nproc >= 1 and nodes >= 1; got gpus={self.gpus}, nproc={self.nproc}, "
                f"nodes={self.nodes}"
            )

    @property
    def world(self) -> int:
        return self.nproc * self.nodes


@dataclass(frozen=True)
class RunPlan:
    nproc: int  # ranks per node
    backend: str  # launch()'s backend: "auto" (nccl with GPUs, gloo without) or "gloo"
    device: str  # "cuda" or "cpu": where the run computes
    devices: int  # devices the run drives: DataParallel's GPUs, DDP's ranks
    env: dict[str, str] = field(default_factory=dict)  # launch()'s env
    nodes: int = 1
    batch: int | None = None  # the run's global batch, where it has one: its ranks split it evenly

    @property
    def world(self) -> int:
        return self.nproc * self.nodes


@dataclass(frozen=True)
class NotebookPlan:
    notebook: str  # "02"
    machine: Machine
    device: str  # the device kind of the runs the notebook compares
    line: str  # one sentence for the learner: where the runs go, and why
    runs: Mapping[str, RunPlan]
    compared: tuple[tuple[str, ...], ...] = ()  # groups of runs whose numbers are put side by side
    sizes: Mapping[str, Any] = field(default_factory=dict)  # chosen by device kind


def placement(
    machine: Machine, ranks: int | None = None, *, nodes: int = 1, batch: int | None = None
) -> RunPlan:
    """A demo of `ranks` ranks per node (default: the machine's) on `nodes` nodes, on what the machine has."""
    ranks = machine.nproc if ranks is None else ranks
    if ranks < 1:
        raise ValueError(f"a run needs at least one rank per node, got {ranks}")
    if machine.gpus >= ranks:
        return RunPlan(ranks, "auto", "cuda", ranks, {}, nodes, batch)
    env = {"CUDA_VISIBLE_DEVICES": ""} if machine.gpus else {}
    return RunPlan(ranks, "gloo" if machine.gpus else "auto", "cpu", ranks, env, nodes, batch)


def placement_line(machine: Machine, run: RunPlan) -> str:
    """One sentence: where `run` computes on this machine, and why."""
    where = f"{run.nproc} rank(s)" + (f" on each of {run.nodes} nodes" if run.nodes > 1 else "")
    if run.device == "cuda":
        return f"{where} with nccl, one GPU each ({machine.gpus} visible)."
    if machine.gpus == 0:
        return f"{where} on the CPU with gloo (no GPU here)."
    return (
        f"This demo needs {run.nproc} ranks and this machine has {machine.gpus} GPU(s): NCCL needs one GPU per "
        f"rank, so it runs {run.nproc} gloo ranks on the CPU instead."
    )


def by_kind(device: str, sizes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The sizes for `device` ("cpu" or "cuda") from a table keyed by device kind."""
    if device not in sizes:
        raise ValueError(f"no sizes for device kind {device!r}; the table has {sorted(sizes)}")
    return dict(sizes[device])


Planner = Callable[..., NotebookPlan]  # plan(machine, smoke, **options)


def planners() -> dict[str, Planner]:
    """Every notebook's planner, by notebook number ("02"): the `plan` of each chapter's chNN_plan module."""
    from ddp_helpers import chapters

    names = sorted(chapter.name for chapter in pkgutil.iter_modules(chapters.__path__))
    return {n[2:4]: importlib.import_module(f"{chapters.__name__}.{n}.ch{n[2:4]}_plan").plan for n in names}


def plan_for(
    notebook: str, gpus: int, nproc: int, nodes: int = 1, *, smoke: bool = False, **options: Any
) -> NotebookPlan:
    """Notebook `notebook`'s plan for a machine of `gpus` GPUs per node, `nproc` ranks per node, `nodes` nodes."""
    known = planners()
    if notebook not in known:
        raise ValueError(f"no plan for notebook {notebook!r}; plans exist for {', '.join(known)}")
    return known[notebook](Machine(gpus, nproc, nodes), smoke, **options)
