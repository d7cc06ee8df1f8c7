"""Notebook 02: one process, DataParallel and DDP, and the scaling sweep, all on one device kind; then
the demos on live ranks (DDP is a bigger batch, a straggler, the learning-rate rule, mp.spawn) and the
exercise, which need a second rank: at least two, on gloo with the GPUs hidden where GPUs are too few."""

from __future__ import annotations

from .core import Machine, NotebookPlan, RunPlan, placement, placement_line
from .throughput import throughput_plan


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    throughput = throughput_plan(machine.gpus, machine.nproc, smoke)
    runs: dict[str, RunPlan] = {
        "single": throughput.single,
        "dataparallel": throughput.dp,
        "ddp": throughput.ddp,
    }
    runs |= {f"sweep-{n}": run for n, run in throughput.sweep.items()}
    compared: tuple[tuple[str, ...], ...] = (tuple(runs),)
    world = max(machine.nproc, 2)  # a straggler, an average over ranks: a second rank at least
    demo = placement(machine, world)
    runs |= {"demo": demo, "exercise": demo}
    compared += (("demo",),)  # section 5: DDP against one process at the global batch, on rank 0
    line = throughput.line
    if world != machine.nproc or demo.device != throughput.device:
        line += f" The demos on live ranks need two at least: {placement_line(machine, demo)}"
    return NotebookPlan(
        notebook="02",
        machine=machine,
        device=throughput.device,
        line=line,
        runs=runs,
        compared=compared,
        sizes=throughput.sizes,
    )
