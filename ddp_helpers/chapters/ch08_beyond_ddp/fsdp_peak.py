"""fsdp.py --part peak: each rank's true peak over one training step, for `make gpu-check` to hold the
calculator to (`ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_calculator` predicts the end of forward; the step peaks later,
FSDP2's in backward).

On CUDA it resets the allocator's peak before a step after the first two (gradients and Adam's state
in place, as in the calculator's step) and reads `torch.cuda.max_memory_allocated()` after it. The CPU
has no such counter: there each peak is None, and the run only shows that the part works.
"""

import argparse
import gc
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from ddp_helpers.chapters.ch08_beyond_ddp.fsdp_footprint import wrapped

PEAK_STRATEGIES = ("ddp", "fsdp2")


def step_peak(strategy: str, args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> dict:
    """This rank's bytes allocated before the measured step, and its peak during it (None on the CPU)."""
    sizes = argparse.Namespace(
        features=args.features, width=args.width, depth=args.depth, classes=args.classes, seed=args.seed
    )
    module, _, optimizer, _ = wrapped(strategy, "fp32", sizes, mesh, device)
    per_rank = args.global_batch // dist.get_world_size()
    gen = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(per_rank, args.features, generator=gen).to(device)
    y = torch.randint(args.classes, (per_rank,), generator=gen).to(device)

    def step() -> None:
        F.cross_entropy(module(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the calculator's step keeps the gradients

    for _ in range(2):
        step()
    if device.type != "cuda":
        step()
        return {"allocated_before": None, "peak": None}
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return {"allocated_before": before, "peak": torch.cuda.max_memory_allocated(device)}


def part_peak(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> dict[str, Any]:
    """Every rank's step peak for DDP and FSDP2, one after the other, each model freed before the next."""
    result: dict[str, Any] = {"batch_per_rank": args.global_batch // dist.get_world_size(), "peaks": {}}
    for strategy in PEAK_STRATEGIES:
        mine = step_peak(strategy, args, mesh, device)
        gc.collect()  # the model, its optimizer and DDP's reducer go before the next one is measured
        if device.type == "cuda":
            torch.cuda.empty_cache()
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        result["peaks"][strategy] = every
    return result
