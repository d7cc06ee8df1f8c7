"""Notebook 09: torch.compile with DDP, on live ranks, and its exercises' live ranks.

Every section compares ranks with each other (the graphs each compiled, the weights each reached), so
the live ranks are at least two: NCCL where each has a GPU of its own, else gloo on the CPU with the
GPUs hidden. Each rank's experiments take batches of `per_rank_batch` samples, so a run's global
batch is that times its world. The step counts are the same on every device kind; the notebook's
width and depth stay its parameters.
"""

from __future__ import annotations

from .core import Machine, NotebookPlan, by_kind, placement, placement_line

PER_RANK_BATCH = 16  # compile_ddp.batch()'s default: each rank's batch in every experiment
SIZES = {"cpu": {"steps": 20, "bucket_caps": "1,2,25"}, "cuda": {"steps": 20, "bucket_caps": "1,2,25"}}
SMOKE_SIZES = {"cpu": {"steps": 6, "bucket_caps": "1,25"}, "cuda": {"steps": 6, "bucket_caps": "1,25"}}


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    world = max(machine.nproc, 2)  # one rank has nothing to overlap and no other rank to differ from
    live = placement(machine, world, batch=PER_RANK_BATCH * world)
    line = placement_line(machine, live)
    if world != machine.nproc:
        line = f"nproc = {machine.nproc}, but these demos compare ranks: they run {world}. {line}"
    return NotebookPlan(
        notebook="09",
        machine=machine,
        device=live.device,
        line=line,
        runs={"live": live, "exercises": placement(machine, world)},
        sizes=by_kind(live.device, SMOKE_SIZES if smoke else SIZES),
    )
