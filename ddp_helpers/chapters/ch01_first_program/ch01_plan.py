"""Notebook 01: the single-device script, the live ranks that build DDP step by step, and ddp.py whole.

The single-device script and ddp.py are compared (their losses and accuracy side by side), so both run
on the device kind ddp.py's ranks get: NCCL where every rank has a GPU of its own, else gloo on the CPU
with the GPUs hidden, from the single script too. The live ranks need a second rank to exchange
anything, so they run at least two.
"""

from __future__ import annotations

from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, RunPlan, placement, placement_line


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    whole = placement(machine)
    single = RunPlan(1, whole.backend, whole.device, 1, dict(whole.env))  # on ddp.py's device kind
    world = max(machine.nproc, 2)  # one rank has nobody to exchange with
    live = placement(machine, world)
    line = f"ddp.py and the single-device script: {placement_line(machine, whole)}"
    if world != machine.nproc:
        line += f" The live ranks need two: {placement_line(machine, live)}"
    return NotebookPlan(
        notebook="01",
        machine=machine,
        device=whole.device,
        line=line,
        runs={"single": single, "whole": whole, "live": live},
        compared=(("single", "whole"),),
    )
