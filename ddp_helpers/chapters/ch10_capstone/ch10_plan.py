"""Notebook 10: the capstone check runs the learner's script at 2 ranks, then 3 (an odd world), or 2 in smoke mode."""

from __future__ import annotations

from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, placement, placement_line

WORLDS = (2, 3)
SMOKE_WORLDS = (2,)


def plan(machine: Machine, smoke: bool, worlds: tuple[int, ...] | None = None) -> NotebookPlan:
    sizes = worlds or (SMOKE_WORLDS if smoke else WORLDS)
    runs = {f"check-{n}": placement(machine, n) for n in sizes}
    first = runs[f"check-{sizes[0]}"]
    lines = [placement_line(machine, run) for run in runs.values()]
    return NotebookPlan(
        notebook="10",
        machine=machine,
        device=first.device,
        line=f"your script will be checked at {' and then '.join(map(str, sizes))} rank(s): "
        + " ".join(lines),
        runs=runs,
        sizes={"worlds": sizes},
    )
