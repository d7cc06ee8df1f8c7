"""DDP built by hand, four ways (naive, flat, overlap, bucketed), each checked against torch's DDP and timed.

torchrun --nproc-per-node 2 handmade_ddp.py --variants naive,flat,overlap,bucketed,ddp --steps 10
"""

import argparse
import statistics
import time
from collections.abc import Iterable
from typing import Any, Self

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_helpers.chapters.ch07_inside_ddp.experiment_kit import (
    Batches,
    add_arguments,
    build_model,
    make_batches,
    slowest,
    synchronize,
)
from ddp_helpers.rank import teardown
from ddp_helpers.rank.distributed import DistInfo, setup_distributed
from ddp_helpers.rank.metrics import MetricsWriter

VARIANTS = ("naive", "flat", "overlap", "bucketed", "ddp")


def broadcast_from_rank0(tensors: Iterable[torch.Tensor]) -> None:
    """Give every rank rank 0's values, in place: DDP does this for weights and buffers."""
    for tensor in tensors:
        dist.broadcast(tensor, src=0)


class HandmadeDDP(nn.Module):
    """What the four versions share: start from rank 0's state, sync buffers, and take hooks off again."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.allreduces = 0  # per step, for the table
        self.hooks: list[torch.utils.hooks.RemovableHandle] = []
        broadcast_from_rank0(module.state_dict().values())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():  # DDP's default (broadcast_buffers / forward_sync_buffers), simplified
            broadcast_from_rank0(self.module.buffers())
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Make every gradient the mean over ranks before step(): each version does it its own way."""
        raise NotImplementedError

    def remove(self) -> None:
        """Take this wrapper's hooks off the model's parameters."""
        for handle in self.hooks:
            handle.remove()
        self.hooks.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


# ---------------------------------------------------------------------------- 1. naive


class NaiveDDP(HandmadeDDP):
    """After backward(): one blocking all-reduce per gradient, then divide by the world size."""

    def finish_gradient_synchronization(self) -> None:
        self.allreduces = 0
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)  # SUM over ranks (gloo has no AVG)
                param.grad.div_(dist.get_world_size())
                self.allreduces += 1


# ---------------------------------------------------------------------------- 2. flat


class FlatDDP(HandmadeDDP):
    """After backward(): one all-reduce of all gradients flattened into one buffer."""

    def finish_gradient_synchronization(self) -> None:
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = _flatten_dense_tensors(grads)  # one copy in, one message instead of len(grads)
        dist.all_reduce(flat)
        flat.div_(dist.get_world_size())
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(synced)  # ...and one copy out
        self.allreduces = 1


# ---------------------------------------------------------------------------- 3. overlap


class OverlapDDP(HandmadeDDP):
    """Each gradient's all-reduce starts from a hook the moment autograd has accumulated it."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        self.handles: list[dist.Work] = []
        for param in module.parameters():
            if param.requires_grad:  # keep the handle: remove() takes the hook off again
                self.hooks.append(param.register_post_accumulate_grad_hook(self._on_grad_ready))

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        assert param.grad is not None  # the hook runs once the gradient is accumulated
        param.grad.div_(dist.get_world_size())  # pre-divide, as DDP does: the sum is the mean
        handle = dist.all_reduce(param.grad, async_op=True)  # returns at once; wait() for the sum
        assert handle is not None  # (None only without async_op)
        self.handles.append(handle)

    def finish_gradient_synchronization(self) -> None:
        for handle in self.handles:
            handle.wait()  # before step(): the optimizer must see the averaged gradients
        self.allreduces = len(self.handles)
        self.handles.clear()


# ---------------------------------------------------------------------------- 4. buckets


class BucketedDDP(HandmadeDDP):
    """Overlap, but in buckets of about `bucket_cap_mb`: fewer, larger messages."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0) -> None:
        super().__init__(module)
        self.buckets: list[list[nn.Parameter]] = [[]]
        cap, size = bucket_cap_mb * 2**20, 0
        for param in reversed([p for p in module.parameters() if p.requires_grad]):
            if size >= cap:  # a bucket closes once it holds at least the cap
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(param)
            size += param.numel() * param.element_size()
        self.bucket_of: dict[torch.Tensor, int] = {
            param: i for i, bucket in enumerate(self.buckets) for param in bucket
        }
        self.pending = [len(bucket) for bucket in self.buckets]
        self.in_flight: list[tuple[dist.Work, torch.Tensor, list[torch.Tensor]]] = []
        for p in self.bucket_of:
            self.hooks.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        index = self.bucket_of[param]
        self.pending[index] -= 1
        if self.pending[index] == 0:  # every gradient in the bucket is ready: send it
            grads = [p.grad for p in self.buckets[index] if p.grad is not None]  # all of them, now
            flat = _flatten_dense_tensors(grads).div_(dist.get_world_size())
            handle = dist.all_reduce(flat, async_op=True)
            assert handle is not None  # (None only without async_op)
            self.in_flight.append((handle, flat, grads))

    def finish_gradient_synchronization(self) -> None:
        for handle, flat, grads in self.in_flight:
            handle.wait()
            for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(synced)
        self.allreduces = len(self.in_flight)
        self.in_flight.clear()
        incomplete = [i for i, pending in enumerate(self.pending) if pending]
        self.pending = [len(bucket) for bucket in self.buckets]
        if incomplete:  # never sent: those gradients are this rank's own, not the mean
            raise RuntimeError(
                f"bucket(s) {incomplete} never filled: a parameter got no gradient in this backward "
                "(unused in forward). DDP raises here too, at the next forward, unless "
                "find_unused_parameters=True."
            )


# ---------------------------------------------------------------------------- wrapping


def wrap(
    variant: str, model: nn.Module, bucket_cap_mb: float | None, device: torch.device
) -> DDP | HandmadeDDP:
    """`model` inside DDP or a hand-made version; a cap of None means DDP's default (25 MiB for ours)."""
    if variant == "ddp":
        options: dict[str, Any] = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **options)
    return handmade(variant, model, bucket_cap_mb)


def handmade(variant: str, model: nn.Module, bucket_cap_mb: float | None) -> HandmadeDDP:
    if variant == "bucketed":
        return BucketedDDP(model, 25.0 if bucket_cap_mb is None else bucket_cap_mb)
    return {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP}[variant](model)


# ---------------------------------------------------------------------------- one variant


def train_variant(
    variant: str,
    args: argparse.Namespace,
    info: DistInfo,
    batches: Batches,
    writer: MetricsWriter,
    first_step: int = 0,
) -> tuple[list[float], list[int], torch.Tensor, torch.Tensor, float]:
    """Train `variant` on `batches` from the seeded initial weights; its step times, final weights and buffers."""
    torch.manual_seed(args.seed)  # the same initial weights for every variant
    model = build_model(args.model, args.width, args.depth, batch_norm=args.batch_norm).to(info.device)
    if args.rewrap and variant != "ddp":
        # a notebook cell run twice wraps the same model twice: the first wrapper's hooks must go
        handmade(variant, model, args.bucket_cap_mb).remove()
    wrapped = wrap(variant, model, args.bucket_cap_mb, info.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    times, allreduces = [], []
    for step, (inputs, targets) in enumerate(batches, start=1):
        synchronize(info.device)
        start = time.perf_counter()
        loss = F.cross_entropy(wrapped(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP and variants 3-4 all-reduce during this call
        if isinstance(wrapped, HandmadeDDP):  # not DDP
            wrapped.finish_gradient_synchronization()  # variants 1-2 all-reduce here; 3-4 wait here
            allreduces.append(wrapped.allreduces)
        optimizer.step()
        synchronize(info.device)
        times.append(time.perf_counter() - start)
        writer.log(
            step=first_step + step,
            variant=variant,
            loss=loss.item(),
            step_time_s=times[-1],
            samples=len(inputs),
        )
    if isinstance(wrapped, HandmadeDDP):
        wrapped.remove()  # the model is done with; leave no hook behind on it
    return times, allreduces, *flat_state(model), loss.item()


# ---------------------------------------------------------------------------- the check against DDP
def flat_state(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """All weights, and all floating-point buffers (BatchNorm's running statistics), each as one vector."""
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    buffers = [b.reshape(-1) for b in model.buffers() if b.is_floating_point()]
    return weights, (torch.cat(buffers).cpu() if buffers else torch.zeros(0))


def compare_to_ddp(
    variant: str,
    args: argparse.Namespace,
    info: DistInfo,
    times: list[float],
    allreduces: list[int],
    state: tuple[torch.Tensor, torch.Tensor],
    reference: tuple[torch.Tensor, torch.Tensor],
) -> dict:
    """One variant's step time and its weights and buffers against DDP's, on every rank; raises if they differ."""
    (weights, buffers), (ddp_weights, ddp_buffers) = state, reference
    # this rank's weights and buffers against DDP's on this rank: rank 1's running statistics
    # match DDP's only if the version broadcast rank 0's buffers before each forward, as DDP does
    max_diff = (weights - ddp_weights).abs().max().item()  # this rank's
    buffer_diff = (buffers - ddp_buffers).abs().max().item() if len(buffers) else 0.0
    matches = torch.allclose(torch.cat(state), torch.cat(reference), rtol=args.rtol, atol=args.atol)
    all_match = slowest(0.0 if matches else 1.0, info.device) == 0.0  # every rank agrees
    r: dict[str, Any] = {
        "step_time_s": slowest(statistics.median(times[args.warmup_steps :]), info.device),
        "allreduces_per_step": allreduces[-1] if allreduces else None,
        "max_abs_diff_vs_ddp": slowest(max_diff, info.device),
        "buffer_max_abs_diff_vs_ddp": slowest(buffer_diff, info.device),
        "equal_to_ddp": all_match,
    }
    if info.is_main:
        print(
            f"{variant:>9}: {r['step_time_s'] * 1e3:8.2f} ms/step, max |w - w_ddp| = "
            f"{r['max_abs_diff_vs_ddp']:.2e}, buffers {r['buffer_max_abs_diff_vs_ddp']:.2e} "
            f"({'equal' if all_match else 'DIFFERENT'})",
            flush=True,
        )
    if not all_match:
        raise AssertionError(
            f"{variant}: weights or buffers after {args.steps} steps differ from DDP's on some rank "
            f"(max {r['max_abs_diff_vs_ddp']:.3e} in the weights, "
            f"{r['buffer_max_abs_diff_vs_ddp']:.3e} in the buffers)"
        )
    return r


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}"
    )
    add_arguments(p, "runs/handmade_ddp")
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="bucketed and ddp; default: DDP's")
    p.add_argument("--rtol", type=float, default=None, help="weight check; default 1e-4 (CPU), 1e-3 (GPU)")
    p.add_argument("--atol", type=float, default=None, help="weight check; default 1e-6 (CPU), 1e-5 (GPU)")
    p.add_argument("--rewrap", action="store_true", help="wrap, remove() and wrap again (a rerun cell)")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown or not args.variants:
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.steps <= args.warmup_steps:
        p.error("need --steps > --warmup-steps")
    return args


@record
def main(argv: list[str] | None = None) -> None:  # argv: for a caller in-process (live ranks)
    args = parse_args(argv)
    info = setup_distributed()
    if not info.distributed:
        raise SystemExit("run me under torchrun: a hand-made DDP needs a process group")
    on_gpu = info.device.type == "cuda"
    if on_gpu:
        # the same kernels for every variant; a few backward kernels still add with atomics, in any
        # order, so GPU weights match to a looser tolerance
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    args.rtol = args.rtol if args.rtol is not None else (1e-3 if on_gpu else 1e-4)
    args.atol = args.atol if args.atol is not None else (1e-5 if on_gpu else 1e-6)
    writer = MetricsWriter(args.run_dir, info.rank)
    # DDP goes first: it is the reference the others are checked against
    order = ["ddp"] + [v for v in args.variants if v != "ddp"]
    writer.write_plan(len(order) * args.steps)
    batches = make_batches(
        args.model, args.width, args.image_size, args.batch_size, args.steps, info.rank, info.device
    )
    results, reference = {}, None
    for index, variant in enumerate(order):
        # steps count on across variants: one series per rank for the progress bar and the metrics
        times, allreduces, weights, buffers, final_loss = train_variant(
            variant, args, info, batches, writer, index * args.steps
        )
        reference = (weights, buffers) if reference is None else reference
        results[variant] = compare_to_ddp(
            variant, args, info, times, allreduces, (weights, buffers), reference
        )
        results[variant]["final_loss"] = final_loss
    reference_model = build_model(args.model, args.width, args.depth, batch_norm=args.batch_norm)
    n_params = sum(p.numel() for p in reference_model.parameters())
    n_buffers = sum(b.numel() for b in reference_model.buffers() if b.is_floating_point())
    writer.write_summary(
        {
            "world_size": info.world_size,
            "backend": info.backend,
            "device": info.device.type,
            "torch_version": torch.__version__,
            "model": args.model,
            "parameters": n_params,
            "buffer_values": n_buffers,
            "parameter_tensors": len(list(reference_model.parameters())),
            "rewrap": args.rewrap,
            "steps": args.steps,
            "bucket_cap_mb": args.bucket_cap_mb,
            "rtol": args.rtol,
            "atol": args.atol,
            "variants": results,
        }
    )
    writer.close()


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
