"""Notebook 02: one process, DataParallel and DDP, and the scaling sweep, all on one device kind."""

from __future__ import annotations

from .core import Machine, NotebookPlan
from .throughput import throughput_plan


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    throughput = throughput_plan(machine.gpus, machine.nproc, smoke)
    runs = {"single": throughput.single, "dataparallel": throughput.dp, "ddp": throughput.ddp}
    runs |= {f"sweep-{n}": run for n, run in throughput.sweep.items()}
    return NotebookPlan(
        notebook="02",
        machine=machine,
        device=throughput.device,
        line=throughput.line,
        runs=runs,
        compared=(tuple(runs),),
        sizes=throughput.sizes,
    )
