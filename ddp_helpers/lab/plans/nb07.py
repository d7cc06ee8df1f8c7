"""Notebook 07: the hand-made DDPs against torch's, and the experiments inside DDP, on one set of ranks.

Every section compares configurations on the same ranks (an all-reduce over one rank has nothing to
average, so at least two): NCCL where each has a GPU of its own, else gloo on the CPU, with the GPUs
hidden. The model's sizes go by device kind: on GPUs a ResNet-50 at ImageNet's size, whose backward is
long enough to hide the all-reduces; on the CPU a deep MLP whose layers fill DDP's buckets.
"""

from __future__ import annotations

from .core import Machine, NotebookPlan, by_kind, placement, placement_line

# width x depth: the MLP's square layers; 1024 gives 4 MiB of gradients per layer, so DDP's default
# 25 MiB buckets hold a few layers each; 256 (smoke) gives 0.25 MiB. batch_size is per rank: enough
# rows for BatchNorm's statistics and for backward to take longer than a message.
SIZES = {
    "cpu": {"model": "mlp", "width": 1024, "depth": 8, "image_size": 64, "batch_size": 64},
    "cuda": {"model": "resnet50", "width": 1024, "depth": 8, "image_size": 224, "batch_size": 32},
}
SMOKE = {"model": "mlp", "width": 256, "depth": 6, "batch_size": 16}  # fast on 2 CPU cores, for CI
SMOKE_SIZES = {kind: {**sizes, **SMOKE} for kind, sizes in SIZES.items()}


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    world = max(machine.nproc, 2)  # an all-reduce over one rank has nothing to average
    demo = placement(machine, world)
    line = placement_line(machine, demo)
    if world != machine.nproc:
        line = f"nproc = {machine.nproc}, but every demo here needs two ranks: they run {world}. {line}"
    return NotebookPlan(
        notebook="07",
        machine=machine,
        device=demo.device,
        line=line,
        runs={"demo": demo, "exercise": demo},
        compared=(("demo",),),
        sizes=by_kind(demo.device, SMOKE_SIZES if smoke else SIZES),
    )
