"""Each notebook's choices (backend, device, visible GPUs, sizes, the runs it compares), as a pure plan."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from ddp_helpers import chapters
from ddp_helpers.kernel.lab.plan_core import (
    Machine,
    NotebookPlan,
    RunPlan,
    by_kind,
    placement,
    placement_line,
)

Planner = Callable[..., NotebookPlan]  # plan(machine, smoke, **options)


def planners() -> dict[str, Planner]:
    """Every notebook's planner, by notebook number ("02"): the `plan` of each chapter's chNN_plan module."""
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


__all__ = [
    "Machine",
    "NotebookPlan",
    "RunPlan",
    "by_kind",
    "placement",
    "placement_line",
    "plan_for",
    "planners",
]
