"""Notebook 07: the hand-made DDPs against torch's, and the experiments inside DDP, on one set of ranks.

At least two ranks; on GPUs a ResNet-50, on the CPU a deep MLP whose layers fill DDP's buckets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, by_kind, placement, placement_line

# width 1024: 4 MiB of gradients per layer, a few layers per 25 MiB bucket (smoke's 256: 0.25 MiB)
SIZES = {
    "cpu": {"model": "mlp", "width": 1024, "depth": 8, "image_size": 64, "batch_size": 64},
    "cuda": {"model": "resnet50", "width": 1024, "depth": 8, "image_size": 224, "batch_size": 32},
}
SMOKE = {"model": "mlp", "width": 256, "depth": 6, "batch_size": 16}  # fast on 2 CPU cores, for CI
SMOKE_SIZES = {kind: {**sizes, **SMOKE} for kind, sizes in SIZES.items()}
# steps per measured configuration (warmup_steps untimed), the bucket_cap_mb sweep, micro-batches per step
LENGTHS: dict[bool, dict[str, Any]] = {
    False: {"steps": 20, "warmup_steps": 2, "bucket_caps": "1,5,25,100", "accumulate": 4, "profile_steps": 3},
    True: {"steps": 5, "warmup_steps": 1, "bucket_caps": "0.25,1,25", "accumulate": 3, "profile_steps": 2},
}
# smoke's small model needs small buckets to have more than one: 0.25 MiB is one smoke layer
SMOKE_BUCKET_CAP_MB = 0.25
# The checks' margins: DDP's buckets hide HIDDEN_FACTOR x the all-reduce one bucket hides (sent after
# backward, it overlaps only timing residue); the alpha-beta line's R2; "close to DDP" as a step-time ratio
HIDDEN_FACTOR = 2
MIN_R2 = 0.9
CLOSE_TO_DDP = 1.5


def _size_args(sizes: dict[str, Any], smoke: bool) -> list[Any]:
    lengths = LENGTHS[smoke]
    args: list[Any] = ["--model", sizes["model"], "--width", sizes["width"], "--depth", sizes["depth"]]
    args += ["--image-size", sizes["image_size"], "--batch-size", sizes["batch_size"]]
    args += ["--steps", lengths["steps"], "--warmup-steps", lengths["warmup_steps"]]
    return args + (["--bucket-cap-mb", SMOKE_BUCKET_CAP_MB] if smoke else [])


def handmade_args(sizes: dict[str, Any], smoke: bool, run_dir: Path | str) -> list[str]:
    """handmade_ddp.py's arguments: BatchNorm (so there are buffers to compare) and a rewrap (a rerun cell)."""
    args = [*_size_args(sizes, smoke), "--batch-norm", "--rewrap", "--run-dir", run_dir]
    return [str(a) for a in args]


def inside_args(sizes: dict[str, Any], smoke: bool, experiments: str) -> list[str]:
    """inside_ddp.py's arguments for the comma-separated `experiments`."""
    lengths = LENGTHS[smoke]
    args = [*_size_args(sizes, smoke), "--experiments", experiments, "--bucket-caps", lengths["bucket_caps"]]
    args += ["--accumulate", lengths["accumulate"], "--profile-steps", lengths["profile_steps"]]
    return [str(a) for a in args]


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
