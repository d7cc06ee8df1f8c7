"""Notebook 10: the capstone check runs the learner's script under torchrun at each of its world sizes.

The world sizes: 2 ranks, then 3 (an odd world, where the all-reduce's order shows), or 2 only in
smoke mode; `worlds=` in the notebook (its `nproc` parameter) checks one size instead. The script
picks nccl itself where every local rank has a GPU; at a size with fewer GPUs than ranks the check
hides the GPUs, so that the script's gloo ranks compute on the CPU, as its own rule says they would.
"""

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
