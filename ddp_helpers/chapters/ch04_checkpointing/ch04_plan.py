"""Notebook 04 and its companion (notebooks/deeper/04_checkpoint_internals.ipynb): the reference run and
its resumes, the demos where ranks disagree or fail, and two one-off gloo jobs (a save killed mid-write,
the order of a sum). The lesson runs "train" (the reference, its resumes), "choose" and "exercise"; the
companion runs "train" (the preempted run), "crash", "sum-order", "elastic" and "elastic-reference".

The resumes are compared with the reference, so they run exactly where it runs: NCCL where every rank
has a GPU of its own, else gloo on the CPU with the GPUs hidden. Choosing a checkpoint, the elastic
restart and the exercise need a second rank (to disagree, to fail), so they run at least two; the
elastic run is compared with an uninterrupted run of its own shape (the reference where the shapes match),
on its own device kind: on one GPU with one rank that is the CPU, apart from the reference's GPU.
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
