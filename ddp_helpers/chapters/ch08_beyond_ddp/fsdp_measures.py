"""What fsdp.py measures: bytes held per rank, bytes each collective moves, and step times.

Kept apart from fsdp.py so that the sharding reads on its own; notebook 08 shows `CollectiveCounter`.
"""

import inspect
import math
import statistics
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

T = TypeVar("T")


def local_shard(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard


def flattened(tensors: Iterable[torch.Tensor | None]) -> torch.Tensor:
    """`tensors` (parameters or their gradients) as one flat tensor; a DTensor counts whole (all-gathered)."""
    whole = [t.full_tensor() if isinstance(t, DTensor) else t for t in tensors if t is not None]
    return torch.cat([t.flatten() for t in whole])


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank holds for `tensors`: a DTensor counts its local shard only."""
    return sum(local_shard(t).numel() * local_shard(t).element_size() for t in tensors)


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return local_bytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


def memory_row(
    model: nn.Module, optimizer: torch.optim.Optimizer, ddp_buckets: Collection[torch.Tensor] = ()
) -> dict[str, int]:
    """Bytes this rank holds. `ddp_buckets`: DDP's flat gradient buckets (from a comm hook); they count
    only where .grad is not a view of them (DDP's default, gradient_as_bucket_view=False: a second copy)."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    grad_storages = {local_shard(g).untyped_storage().data_ptr() for g in grads}
    return {
        "weights": local_bytes(params),
        "grads": local_bytes(grads),
        "ddp_buckets": local_bytes(
            {b.untyped_storage().data_ptr(): b for b in ddp_buckets}[ptr]
            for ptr in {b.untyped_storage().data_ptr() for b in ddp_buckets} - grad_storages
        ),
        "optimizer": optimizer_bytes(optimizer),
    }


class CollectiveCounter:
    """Counts the bytes of the collectives FSDP2 and ZeRO-1 call, by wrapping torch.distributed's functions.

    torch 2.7's FSDP2 calls all_gather_into_tensor / reduce_scatter_tensor, torch 2.14's
    all_gather_single / reduce_scatter_single (which may call the former): only the outermost counts.
    """

    NAMES = {
        "all_gather_into_tensor": ("all_gather", 0),  # (kind, index of the full-size tensor)
        "all_gather_single": ("all_gather", 0),
        "reduce_scatter_tensor": ("reduce_scatter", 1),
        "reduce_scatter_single": ("reduce_scatter", 1),
        "broadcast": ("broadcast", 0),  # ZeroRedundancyOptimizer sends each rank's updated weights
    }

    def __init__(self) -> None:
        self.bytes = {"all_gather": 0, "reduce_scatter": 0, "broadcast": 0}
        self.calls = {"all_gather": 0, "reduce_scatter": 0, "broadcast": 0}
        self._depth = 0
        self._originals: dict[str, Callable[..., Any]] = {}

    def __enter__(self) -> "CollectiveCounter":
        for name, (kind, index) in self.NAMES.items():
            if hasattr(dist, name):
                self._originals[name] = original = getattr(dist, name)
                setattr(dist, name, self._wrap(original, kind, index))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)

    def _wrap(self, original: Callable[..., Any], kind: str, index: int) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                bound = inspect.signature(original).bind(*args, **kwargs).arguments
                full = list(bound.values())[index]  # the names differ between torch versions
                self.bytes[kind] += full.numel() * full.element_size()
                self.calls[kind] += 1
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted


def padded_numel(model: nn.Module, world_size: int) -> int:
    """Elements FSDP2 moves for `model`'s parameters: dim 0 padded to a multiple of the world size."""
    return sum(
        math.ceil(p.shape[0] / world_size) * world_size * (p.numel() // p.shape[0])
        for p in model.parameters()
    )


def timed_steps(step_fn: Callable[[int], object], steps: int, device: torch.device) -> float:
    """Median seconds per step, after one warm-up step."""
    times = []
    for step in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step_fn(step)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step:
            times.append(time.perf_counter() - start)
    slowest = torch.tensor(statistics.median(times) if times else 0.0, device=device)  # nccl: on the GPU
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step lasts until the slowest rank is done
    return slowest.item()


def gathered(value: T) -> list[T]:
    """`value` from every rank, in rank order."""
    everyone = [value] * dist.get_world_size()  # all_gather_object fills each slot with that rank's
    dist.all_gather_object(everyone, value)
    return everyone
