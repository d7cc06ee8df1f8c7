"""What one rank holds at the end of forward, and what it sends per step: the calculator's numbers, measured.

footprint(mesh, device, strategy="zero2", precision="bf16", recompute=True, width=64, depth=2, batch=8)
"""

import argparse
import gc
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_helpers.chapters.ch08_beyond_ddp.fsdp_model import (
    BlockMLP,
    CollectiveCounter,
    MixedPrecisionPolicy,
    build_model,
    checked_fsdp,
    gathered,
    global_batch,
    local_bytes,
    local_shard,
    memory_row,
    my_slice,
)


def wrapped(
    strategy: str, precision: str, args: argparse.Namespace, mesh: DeviceMesh, device: torch.device
) -> tuple[nn.Module, BlockMLP, torch.optim.Optimizer, list[torch.Tensor]]:
    """(the module to call, the plain model, its Adam, DDP's flat gradient buckets as its comm hook sees them)."""
    buckets: list[torch.Tensor] = []
    if strategy in ("zero2", "fsdp2"):  # ZeRO-2: each unit stays gathered from its forward to its backward
        options: dict = {"reshard_after_forward": False} if strategy == "zero2" else {}
        if precision == "bf16":
            options["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32
            )
        model, _ = checked_fsdp(args, mesh, device, **options)  # pytorch#162338 handled there
        return model, model, torch.optim.Adam(model.parameters(), lr=args.adam_lr), buckets
    model = build_model(args, device)
    # True: each .grad is a view of its bucket, one copy; the default keeps the buckets as a second copy
    ddp = DDP(model, gradient_as_bucket_view=strategy != "ddp_default")

    def keep_bucket(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buckets.append(bucket.buffer())
        average = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(average, async_op=True).get_future().then(lambda fut: fut.value()[0])

    ddp.register_comm_hook(None, keep_bucket)
    optimizer: torch.optim.Optimizer
    if strategy == "zero1":  # each rank keeps Adam's state for its own share of the parameters only
        optimizer = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.Adam, lr=args.adam_lr
        )
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr)
    return ddp, model, optimizer, buckets


def saved_activation_bytes(
    model: nn.Module,
) -> tuple[dict[int, int], torch.autograd.graph.saved_tensors_hooks]:
    """A saved_tensors_hooks pair summing what autograd saves, each storage once, parameters left out."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        weights = {local_shard(p).untyped_storage().data_ptr() for p in model.parameters()}
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    return seen, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


def held_at_forward_end(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    buckets: list[torch.Tensor],
    loss_fn: Callable[[], torch.Tensor],
) -> tuple[dict, torch.Tensor]:
    """Run `loss_fn` (forward and loss), count what this rank holds once it returns; return both."""
    seen, hooks = saved_activation_bytes(model)
    with hooks:
        loss = loss_fn()
    params = list(model.parameters())
    # FSDP2: the sharded fp32 weights always; a unit whose weights are still gathered shows them as
    # plain tensors (a resharded unit shows its DTensor shards again)
    sharded = [f.sharded_param for f in fsdp_params(model)]  # FSDP2: gradients live on the shards
    gathered = sum(p.nbytes for p in params if not isinstance(p, DTensor))
    row = memory_row(model, getattr(optimizer, "optim", optimizer), buckets)  # DDP: buckets not .grad's views
    held = {
        "parameters": local_bytes(sharded) + gathered if sharded else local_bytes(params),
        "gradients": local_bytes(p.grad for p in sharded or params if p.grad is not None)
        + row["ddp_buckets"],
        "optimizer": row["optimizer"],
        "activations": sum(seen.values()),
    }
    return held, loss


def fsdp_params(model: nn.Module) -> list:
    """FSDP2's record of each sharded parameter (`sharded_param`: this rank's DTensor shard)."""
    found = []
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state else None
        if group is not None:
            found.extend(group.fsdp_params)
    return found


def footprint(
    mesh: DeviceMesh,
    device: torch.device,
    strategy: str,
    precision: str = "fp32",
    recompute: bool = False,
    **sizes: int,
) -> dict:
    """This rank's bytes at the end of forward in the third step, and the bytes sent in that step."""
    args = argparse.Namespace(**{"features": 32, "classes": 10, "seed": 0, "adam_lr": 1e-3, **sizes})
    module, model, optimizer, buckets = wrapped(strategy, precision, args, mesh, device)
    model.recompute = recompute
    gen = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(args.batch, args.features, generator=gen).to(device)
    y = torch.randint(args.classes, (args.batch,), generator=gen).to(device)

    def loss_fn() -> torch.Tensor:
        return F.cross_entropy(module(x), y)

    for _ in range(2):  # gradients and Adam's state come to exist; DDP rebuilds its buckets in step 2
        buckets.clear()  # DDP keeps the last step's buckets and hands the same ones to its hook each step
        loss_fn().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    first_step = len(buckets)
    with CollectiveCounter() as counter:
        held, loss = held_at_forward_end(model, optimizer, buckets, loss_fn)
        loss.backward()
        optimizer.step()
    all_reduced = sum(b.nbytes for b in buckets[first_step:])  # DDP's all-reduces: one per bucket
    return {**held, "sent": {**counter.bytes, "all_reduce": all_reduced}}


# ---------------------------------------------------------------------------- fsdp.py --part peak
# each rank's true peak over one training step, for `make gpu-check` to hold the calculator to (it predicts the
# end of forward; the step peaks later, FSDP2's in backward). On CUDA the allocator's peak is reset before a
# step after the first two (gradients and Adam's state in place) and read after it; the CPU has no such
# counter: there each peak is None, and the run only shows that the part works.

PEAK_STRATEGIES = ("ddp", "fsdp2")


def step_peak(strategy: str, args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> dict:
    """This rank's peak during the measured step (None on the CPU)."""
    module, _, optimizer, _ = wrapped(strategy, "fp32", args, mesh, device)
    x, y = (my_slice(t) for t in global_batch(args, 0, device))

    def step() -> None:
        F.cross_entropy(module(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the calculator's step keeps the gradients

    for _ in range(2):
        step()
    if device.type != "cuda":
        step()
        return {"peak": None}
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return {"peak": torch.cuda.max_memory_allocated(device)}


def part_peak(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> dict[str, Any]:
    """Every rank's step peak for DDP and FSDP2, one after the other, each model freed before the next."""
    result: dict[str, Any] = {"peaks": {}}
    for strategy in PEAK_STRATEGIES:
        mine = step_peak(strategy, args, mesh, device)
        gc.collect()  # the model, its optimizer and DDP's reducer go before the next one is measured
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["peaks"][strategy] = gathered(mine)
    return result
