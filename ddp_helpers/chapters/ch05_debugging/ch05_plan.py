"""Notebook 05: each pitfall as a fresh torchrun job (two ranks at least, to disagree), the out-of-memory
demo (one GPU, only where there is one), and the live ranks of its debugger sections.
"""

from __future__ import annotations

from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, RunPlan, placement, placement_line


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    world = max(machine.nproc, 2)  # a pitfall needs a second rank to disagree with
    demos = placement(machine, world)
    runs: dict[str, RunPlan] = {"pitfalls": demos, "live": demos}
    if machine.gpus:
        runs["oom"] = RunPlan(1, "auto", "cuda", 1)
    line = placement_line(machine, demos)
    if world != machine.nproc:
        line = (
            f"nproc = {machine.nproc}, but every pitfall here needs two ranks: the demos run {world}. {line}"
        )
    return NotebookPlan(
        notebook="05",
        machine=machine,
        device=demos.device,
        line=line,
        runs=runs,
    )
