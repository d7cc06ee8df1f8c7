"""Meta-device initialisation: build the model without memory, shard it, then materialise each rank's shard only;
and `clip_grad_norm_` over sharded gradients."""

import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from ddp_helpers.chapters.ch08_beyond_ddp.fsdp_model import (
    BlockMLP,
    build_model,
    checked_fsdp,
    flattened,
    global_batch,
    local_shard,
    my_slice,
    shard,
)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes this rank's parameters hold: a DTensor's local shard; a meta tensor holds none."""
    return sum(local_shard(p).nbytes for p in model.parameters() if not local_shard(p).is_meta)


def whole_first(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> tuple[list, BlockMLP]:
    model = build_model(args, device)  # every rank holds every weight, full size, for a moment
    trace = [("built", parameter_bytes(model))]
    shard(model, mesh)  # fully_shard copies each rank's rows out; the full tensors are freed
    trace.append(("fully_shard", parameter_bytes(model)))
    return trace, model


def meta_first(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> tuple[list, BlockMLP]:
    with torch.device("meta"):  # shapes and dtypes only: no memory, no initialisation
        model = BlockMLP(args.features, args.width, args.depth, args.classes)
    trace = [("built on meta", parameter_bytes(model))]
    shard(model, mesh)  # the DTensors' shards are meta tensors too
    trace.append(("fully_shard", parameter_bytes(model)))
    model.to_empty(device=device)  # memory for this rank's shards only, uninitialised
    trace.append(("to_empty", parameter_bytes(model)))
    # DTensor's random ops keep one stream over the shards only where the device has an RNG state to
    # set (cuda-like: is_rng_supported_mesh). On the CPU each rank draws its shard from its own
    # generator: seeded alike, every rank would draw the same rows
    torch.manual_seed(args.seed + dist.get_rank())
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.reset_parameters()  # each Linear initialises its own (sharded) weight and bias
    trace.append(("reset_parameters", parameter_bytes(model)))
    return trace, model


def initialised_like_linear(model: BlockMLP) -> dict:
    """How far each block weight's shard is from nn.Linear's init: the largest |value| over the bound, the std ratio."""
    worst = {"max_over_bound": 0.0, "std_ratio_low": math.inf, "std_ratio_high": 0.0}
    for weight in block_weights(model):
        if weight.numel() < 2:
            continue
        bound = 1 / math.sqrt(weight.shape[1])
        ratio = (weight.std() / (bound / math.sqrt(3))).item()
        worst["max_over_bound"] = max(worst["max_over_bound"], weight.abs().max().item() / bound)
        worst["std_ratio_low"] = min(worst["std_ratio_low"], ratio)
        worst["std_ratio_high"] = max(worst["std_ratio_high"], ratio)
    return worst


def shard_fingerprints(model: BlockMLP) -> list[float]:
    """One number per block weight's shard on this rank (its sum): equal on two ranks, equal rows."""
    return [weight.sum().item() for weight in block_weights(model)]


def block_weights(model: BlockMLP) -> list[torch.Tensor]:
    """This rank's shard of each block's Linear weight."""
    return [local_shard(p).detach() for p in model.blocks.parameters() if p.dim() == 2]


def clipped_norm(
    args: argparse.Namespace, mesh: DeviceMesh, device: torch.device, max_norm: float = 0.5
) -> dict:
    """clip_grad_norm_ over FSDP2's DTensor gradients, against one process on the global batch."""
    args = argparse.Namespace(**{**vars(args), "global_batch": 4 * mesh.size()})
    model, _ = checked_fsdp(args, mesh, device)  # gradients the mean over ranks (pytorch#162338)
    reference = build_model(args, device)
    x, y = global_batch(args, 0, device)
    F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()
    F.cross_entropy(reference(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # a DTensor: the full norm
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
    clipped = flattened(p.grad for p in model.parameters())
    return {
        "norm_type": type(norm).__name__,
        "norm": norm.full_tensor().item() if hasattr(norm, "full_tensor") else norm.item(),
        "expected": expected.item(),
        "max_clipped_grad_diff": (clipped - flattened(p.grad for p in reference.parameters()))
        .abs()
        .max()
        .item(),
    }
