"""Notebook 01: the single-device script and ddp.py, compared on the device kind ddp.py's ranks get, and the
live ranks (two at least: one rank exchanges nothing).
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
