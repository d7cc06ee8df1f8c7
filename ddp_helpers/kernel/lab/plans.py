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
    found = {}
    for chapter in pkgutil.iter_modules(chapters.__path__):
        number = chapter.name[2:4]
        module = importlib.import_module(f"{chapters.__name__}.{chapter.name}.ch{number}_plan")
        found[number] = module.plan
    return dict(sorted(found.items()))


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
