"""Notebook 00: the live all_reduce check (two ranks at least: one moves no data) and its bandwidth sweep,
to 1 GiB on GPUs (NVLink's busbw can still rise at 64 MiB), to 64 MiB on a CPU.
"""

from __future__ import annotations

from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, by_kind, placement, placement_line

MAX_BYTES = {"cpu": {"max_bytes": 1 << 26}, "cuda": {"max_bytes": 1 << 30}}
SMOKE_MAX_BYTES = {"cpu": {"max_bytes": 1 << 16}, "cuda": {"max_bytes": 1 << 16}}  # CI: tiny messages


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    world = max(machine.nproc, 2)  # one rank moves no data
    check = placement(machine, world)
    line = placement_line(machine, check)
    if world != machine.nproc:
        line = f"nproc = {machine.nproc}, but one rank moves no data: the check runs {world}. {line}"
    return NotebookPlan(
        notebook="00",
        machine=machine,
        device=check.device,
        line=line,
        runs={"check": check},
        compared=(("check",),),  # the sweep's sizes, side by side
        sizes=by_kind(check.device, SMOKE_MAX_BYTES if smoke else MAX_BYTES),
    )
