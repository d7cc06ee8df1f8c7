"""Notebook 08: the job that compares DDP, ZeRO-1, ZeRO-2 and FSDP2, the live ranks, and the checkpoint demo.

A global batch every world splits evenly: 24 where it splits, else the next multiple of the world.
"""

from __future__ import annotations

import math

from ddp_helpers.kernel.lab.plan_core import (
    Machine,
    NotebookPlan,
    RunPlan,
    by_kind,
    placement,
    placement_line,
)

CHAPTER_BATCH = 24  # global samples per step: splits evenly over 1, 2, 3, 4, 6 and 8 ranks
SIZES = {  # a BlockMLP of `depth` width x width blocks, and the steps of each check
    "cpu": {"width": 512, "depth": 6, "steps": 6},
    "cuda": {"width": 1024, "depth": 8, "steps": 6},  # more work per kernel; the CPU checkpoint demo of
    # a 1- or 2-GPU box still runs it in seconds
}
SMOKE_SIZES = {"cpu": {"width": 48, "depth": 2, "steps": 4}, "cuda": {"width": 48, "depth": 2, "steps": 4}}


def global_batch(world: int) -> int:
    """The chapter's global batch if `world` ranks split it evenly, else the next multiple of `world`."""
    return math.ceil(CHAPTER_BATCH / world) * world


def on_kind(machine: Machine, ranks: int, device: str, batch: int | None = None) -> RunPlan:
    """`ranks` ranks on `device`: one GPU each, or gloo on the CPU with the GPUs hidden."""
    if device == "cuda":  # the resume's 3 ranks got GPUs: the 2 and 1 ranks here have them too
        return RunPlan(ranks, "auto", "cuda", ranks, {}, 1, batch)
    env = {"CUDA_VISIBLE_DEVICES": ""} if machine.gpus else {}
    return RunPlan(ranks, "gloo" if machine.gpus else "auto", "cpu", ranks, env, 1, batch)


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    train = placement(machine, nodes=machine.nodes, batch=global_batch(machine.world))
    live = placement(machine, max(machine.nproc, 2))  # one rank has nothing to shard
    kind = placement(machine, 3).device  # the resume's; the save and the DDP checkpoint follow it
    save, resume = on_kind(machine, 2, kind, CHAPTER_BATCH), on_kind(machine, 3, kind, CHAPTER_BATCH)
    runs = {
        "train": train,
        "live": live,
        "save": save,
        "resume": resume,
        "ddp-checkpoint": on_kind(machine, 1, kind),  # notebook 04's train.py, one process
    }
    line = placement_line(machine, train)
    if live != train:
        line += f" The live ranks: {placement_line(machine, live)}"
    if kind != train.device or machine.nodes > 1:
        line += f" The checkpoint demo (save on 2, resume on 3) runs on one node, on the {kind}."
    compared: tuple[tuple[str, ...], ...] = (("train",),)
    if kind == train.device:  # core's rule: every compared group on the plan's one device kind
        compared += (("save", "resume"),)
    sizes = by_kind(train.device, SMOKE_SIZES if smoke else SIZES)
    return NotebookPlan(
        notebook="08",
        machine=machine,
        device=train.device,
        line=line,
        runs=runs,
        compared=compared,
        sizes=sizes,
    )
