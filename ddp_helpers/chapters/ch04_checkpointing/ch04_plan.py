"""Notebook 04 and its companion: the reference run and its resumes (where it runs), the demos where ranks
disagree or fail (two ranks at least), and one-off gloo jobs (a save killed mid-write, the order of a sum).
"""

from __future__ import annotations

from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, RunPlan, placement, placement_line


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    train = placement(machine)
    world = max(machine.nproc, 2)  # a second rank, to disagree with or to fail
    demo = placement(machine, world)
    line = placement_line(machine, train)
    if world != machine.nproc:
        line += (
            f" The demos where ranks disagree or one fails need two ranks: {placement_line(machine, demo)}"
        )
    runs = {
        "train": train,  # the reference, the resumes, the preempted run
        "choose": demo,
        "elastic": demo,
        "elastic-reference": demo,  # the elastic run's yardstick: the same job, never interrupted
        "exercise": demo,
        "crash": RunPlan(1, "gloo", "cpu", 1),  # one process: only rank 0 writes, no collective needed
        "sum-order": RunPlan(3, "gloo", "cpu", 3),  # the fewest ranks whose sum depends on the order
    }
    # each group on one device kind: on one GPU with nproc = 1 the elastic pair runs on the CPU
    compared: tuple[tuple[str, ...], ...] = (("train",), ("elastic", "elastic-reference"))
    return NotebookPlan(
        notebook="04",
        machine=machine,
        device=train.device,
        line=line,
        runs=runs,
        compared=compared,
    )
