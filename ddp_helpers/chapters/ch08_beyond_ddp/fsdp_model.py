"""fsdp.py's model, data and sharding, and what it measures: bytes held, bytes sent, step times.

On torch 2.7 with gloo FSDP2 sums where it should average (pytorch#162338): `gradient_factor()` measures it.
"""

import argparse
import inspect
import math
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

try:  # torch >= 2.6 exports FSDP2 here; 2.4-2.5 kept it private
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover
    from torch.distributed._composable.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


# ---------------------------------------------------------------------------- the model and its data


class BlockMLP(nn.Module):
    """An input layer, `depth` residual blocks, a head: a transformer's layout with Linear blocks."""

    recompute = False

    def __init__(self, features: int, width: int, depth: int, classes: int):
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + (checkpoint(block, x, use_reentrant=False) if self.recompute else block(x))
        return self.head(x)


def build_model(args: argparse.Namespace, device: torch.device) -> BlockMLP:
    torch.manual_seed(args.seed)  # the same initial weights on every rank and in the reference
    return BlockMLP(args.features, args.width, args.depth, args.classes).to(device)


def global_batch(
    args: argparse.Namespace, step: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of `step`, the same on every rank (a deterministic generator per step)."""
    g = torch.Generator().manual_seed(args.seed * 1000 + step)
    x = torch.randn(args.global_batch, args.features, generator=g)
    y = torch.randint(args.classes, (args.global_batch,), generator=g)
    return x.to(device), y.to(device)


def my_slice(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous share of the global batch (what a DistributedSampler would give)."""
    return tensor.chunk(dist.get_world_size())[dist.get_rank()]


def shard(model: BlockMLP, mesh: DeviceMesh, **fsdp_options: Any) -> BlockMLP:
    """FSDP2: each block is one unit (one all-gather, one reduce-scatter), the root holds the rest."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **fsdp_options)
    fully_shard(model, mesh=mesh, **fsdp_options)  # embed and head: gathered once, kept until backward
    sum_on_one_rank(model, mesh)
    return model


def sum_on_one_rank(model: nn.Module, mesh: DeviceMesh) -> None:
    """On a one-rank mesh, reduce-scatter with SUM (the sum of one gradient is the mean)."""
    if mesh.size() != 1:
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None and getattr(group, "reduce_scatter_reduce_op", ...) is None:
                # torch < 2.9's attribute: the installed torch a checker reads may lack it
                group.reduce_scatter_reduce_op = dist.ReduceOp.SUM  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- pytorch#162338


def gradient_factor(
    mesh: DeviceMesh, device: torch.device, force_sum: bool = False, **fsdp_options: Any
) -> float:
    """FSDP2's gradient divided by the true mean, on a probe where the answer is known."""
    probe = nn.Linear(1, mesh.size(), bias=False, device=device)
    nn.init.ones_(probe.weight)
    sharded = fully_shard(probe, mesh=mesh, **fsdp_options)  # the same module, now an FSDPModule too
    sum_on_one_rank(probe, mesh)
    if force_sum:
        sharded.set_force_sum_reduction_for_comms(True)
    probe(torch.ones(1, 1, device=device)).sum().backward()  # d(sum)/dW = input = 1 on every rank
    grad = probe.weight.grad
    assert isinstance(grad, DTensor)  # sharded: the weight, and so its gradient, is a DTensor
    factor = grad.to_local().mean().reshape(1)
    dist.all_reduce(factor, op=dist.ReduceOp.MAX)
    return factor.item()


def factors_by_reduce(mesh: DeviceMesh, device: torch.device) -> dict[str, float]:
    """`gradient_factor` per reduce dtype, and with torch >= 2.8's set_force_sum_reduction_for_comms(True)."""
    factors = {
        str(dtype).removeprefix("torch."): gradient_factor(
            mesh, device, mp_policy=MixedPrecisionPolicy(reduce_dtype=dtype)
        )
        for dtype in (torch.float32, torch.bfloat16, torch.float16)
    }
    if hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
        factors["float32, force_sum"] = gradient_factor(mesh, device, force_sum=True)
    return factors


def divide_gradients(model: nn.Module, factor: float) -> None:
    """Divide every reduce-scatter output by `factor` (FSDP2's hook after each reduce-scatter)."""

    def divide(reduced: torch.Tensor) -> None:
        reduced.div_(factor)  # in place: FSDP2 keeps the tensor it passed

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_all_reduce_hook(divide)


def checked_fsdp(
    args: argparse.Namespace, mesh: DeviceMesh, device: torch.device, **fsdp_options: Any
) -> tuple[BlockMLP, float]:
    """An FSDP2 model whose gradients are the mean over ranks, whichever torch this is."""
    model = shard(build_model(args, device), mesh, **fsdp_options)
    factor = gradient_factor(mesh, device, **fsdp_options)  # the probe reduces as the model does
    if mesh.size() > 1 and math.isclose(factor, mesh.size(), rel_tol=1e-6):
        divide_gradients(model, factor)
    elif not math.isclose(factor, 1.0, rel_tol=1e-6):
        raise RuntimeError(f"FSDP2's gradients are {factor}x the mean, not a known bug: stopping")
    return model, factor


# ---------------------------------------------------------------------------- training steps (also --part save / resume's)


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    args: argparse.Namespace,
    device: torch.device,
    steps: range,
) -> list[float]:
    """Train `steps` and return each step's loss over the whole global batch (mean of the ranks')."""
    losses = []
    for step in steps:
        x, y = global_batch(args, step, device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(my_slice(x)), my_slice(y))
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # equal slices: the mean of the ranks' means is the global mean
        losses.append(mean.item() / dist.get_world_size())
    return losses


# ---------------------------------------------------------------------------- measuring: bytes held, bytes sent, step times

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
    """Bytes this rank holds."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    grad_storages = {local_shard(g).untyped_storage().data_ptr() for g in grads}
    buckets = {b.untyped_storage().data_ptr(): b for b in ddp_buckets}  # each storage once
    return {
        "weights": local_bytes(params),
        "grads": local_bytes(grads),
        "ddp_buckets": local_bytes(b for ptr, b in buckets.items() if ptr not in grad_storages),
        "optimizer": optimizer_bytes(optimizer),
    }


class CollectiveCounter:
    """Bytes of the collectives FSDP2 and ZeRO-1 call (torch 2.7's or 2.14's names), the outermost counted."""

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


def gathered(value: T) -> list[T]:
    """`value` from every rank, in rank order."""
    everyone = [value] * dist.get_world_size()  # all_gather_object fills each slot with that rank's
    dist.all_gather_object(everyone, value)
    return everyone
