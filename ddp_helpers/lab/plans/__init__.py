"""Each notebook's choices (backend, device, visible GPUs, sizes, the runs it compares), as a pure plan.

`plan_for("04", gpus, nproc)` gives notebook 04's plan for a machine; each notebook's planner lives in
`nbNN.py` beside this file, as `plan(machine, smoke) -> NotebookPlan`, and is found by its name.
core.py holds what plans are made of and the rules they are tested against.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from .core import Machine, NotebookPlan, RunPlan, by_kind, placement, placement_line
from .throughput import ThroughputPlan, sweep_points, throughput_plan

Planner = Callable[..., NotebookPlan]  # plan(machine, smoke, **options)


def planners() -> dict[str, Planner]:
    """Every notebook's planner, by notebook number ("02"): the `plan` of each nbNN module here."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("nb") and module.name[2:].isdigit():
            found[module.name[2:]] = importlib.import_module(f"{__name__}.{module.name}").plan
    return dict(sorted(found.items()))


def plan_for(
    notebook: str, gpus: int, nproc: int, nodes: int = 1, *, smoke: bool = False, **options: Any
) -> NotebookPlan:
    """Notebook `notebook`'s plan for a machine of `gpus` GPUs per node, `nproc` ranks per node, `nodes` nodes.

    `options` go to that notebook's planner (notebook 10's ``worlds``)."""
    known = planners()
    if notebook not in known:
        raise ValueError(f"no plan for notebook {notebook!r}; plans exist for {', '.join(known)}")
    return known[notebook](Machine(gpus, nproc, nodes), smoke, **options)


__all__ = [
    "Machine",
    "NotebookPlan",
    "RunPlan",
    "ThroughputPlan",
    "by_kind",
    "placement",
    "placement_line",
    "plan_for",
    "planners",
    "sweep_points",
    "throughput_plan",
]
