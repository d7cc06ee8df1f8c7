"""DDP built by hand, four ways, each checked against torch's DistributedDataParallel and timed.

    torchrun --nproc-per-node 2 handmade_ddp.py --variants naive,flat,overlap,bucketed,ddp --steps 10

1. NaiveDDP      all-reduce each gradient, one after another, after backward()
2. FlatDDP       copy every gradient into one flat buffer and all-reduce it once
3. OverlapDDP    start each gradient's all-reduce from a hook *during* backward; wait before step()
4. BucketedDDP   the same, but in buckets of --bucket-cap-mb, in reverse registration order (as
                 DDP's Reducer does)

Every variant trains the same model from the same weights on the same data, so after --steps steps
its weights must equal those of the real DDP (float tolerance). Rank 0 writes, per variant, the
median step time (slowest rank), the all-reduces per step and the largest difference to DDP's
weights to <run-dir>/summary.json; every rank logs one metrics line per step.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_helpers import teardown
from ddp_helpers.distributed import setup_distributed
from ddp_helpers.metrics import MetricsWriter

VARIANTS = ("naive", "flat", "overlap", "bucketed", "ddp")


def broadcast_from_rank0(module: nn.Module) -> None:
    """Start every rank from rank 0's weights and buffers, as DDP's constructor does."""
    for tensor in module.state_dict().values():
        dist.broadcast(tensor, src=0)


# ---------------------------------------------------------------------------- 1. naive


class NaiveDDP(nn.Module):
    """After backward(): one blocking all-reduce per gradient, then divide by the world size."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.allreduces = 0  # per step, for the table
        broadcast_from_rank0(module)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        self.allreduces = 0
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)  # SUM over ranks (gloo has no AVG)
                param.grad.div_(dist.get_world_size())
                self.allreduces += 1


# ---------------------------------------------------------------------------- 2. flat


class FlatDDP(nn.Module):
    """After backward(): one all-reduce of all gradients flattened into one buffer."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.allreduces = 0
        broadcast_from_rank0(module)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = _flatten_dense_tensors(grads)  # one copy in, one message instead of len(grads)
        dist.all_reduce(flat)
        flat.div_(dist.get_world_size())
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(synced)  # ...and one copy out
        self.allreduces = 1


# ---------------------------------------------------------------------------- 3. overlap


class OverlapDDP(nn.Module):
    """Each gradient's all-reduce starts, asynchronously, the moment autograd has accumulated it,
    so communication runs while backward computes the earlier layers' gradients."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.handles: list[dist.Work] = []
        self.allreduces = 0
        broadcast_from_rank0(module)
        for param in module.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._on_grad_ready)  # torch >= 2.1

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        param.grad.div_(dist.get_world_size())  # pre-divide, as DDP does: the sum is the mean
        self.handles.append(dist.all_reduce(param.grad, async_op=True))

    def finish_gradient_synchronization(self) -> None:
        for handle in self.handles:
            handle.wait()  # before step(): the optimizer must see the averaged gradients
        self.allreduces = len(self.handles)
        self.handles.clear()


# ---------------------------------------------------------------------------- 4. buckets


class BucketedDDP(nn.Module):
    """Overlap, but in buckets of about `bucket_cap_mb`: fewer, larger messages. Parameters go into
    buckets in reverse registration order, roughly the order backward produces their gradients; a
    bucket's all-reduce starts when its last gradient is ready."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0):
        super().__init__()
        self.module = module
        self.buckets: list[list[nn.Parameter]] = [[]]
        cap, size = bucket_cap_mb * 2**20, 0
        for param in reversed([p for p in module.parameters() if p.requires_grad]):
            if size >= cap:  # a bucket closes once it holds at least the cap
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(param)
            size += param.numel() * param.element_size()
        self.bucket_of = {param: i for i, bucket in enumerate(self.buckets) for param in bucket}
        self.pending = [len(bucket) for bucket in self.buckets]
        self.in_flight: list[tuple[dist.Work, torch.Tensor, list[torch.Tensor]]] = []
        self.allreduces = 0
        broadcast_from_rank0(module)
        for param in self.bucket_of:
            param.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        index = self.bucket_of[param]
        self.pending[index] -= 1
        if self.pending[index] == 0:  # every gradient in the bucket is ready: send it
            grads = [p.grad for p in self.buckets[index]]
            flat = _flatten_dense_tensors(grads).div_(dist.get_world_size())
            self.in_flight.append((dist.all_reduce(flat, async_op=True), flat, grads))

    def finish_gradient_synchronization(self) -> None:
        for handle, flat, grads in self.in_flight:
            handle.wait()
            for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(synced)
        self.allreduces = len(self.in_flight)
        self.in_flight.clear()
        self.pending = [len(bucket) for bucket in self.buckets]


# ---------------------------------------------------------------------------- model and data


def build_model(name: str, width: int, depth: int, classes: int = 10) -> nn.Module:
    """An MLP of `depth` square layers (cheap on the CPU), or a torchvision ResNet (for GPUs)."""
    if name == "mlp":
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(width, classes))
    import torchvision

    return getattr(torchvision.models, name)(num_classes=classes)


def make_batches(
    model_name: str, width: int, image_size: int, batch_size: int, steps: int, rank: int, device
):
    """`steps` batches of this rank's own data (seeded by rank): the same for every variant."""
    generator = torch.Generator().manual_seed(1000 + rank)
    shape = (batch_size, width) if model_name == "mlp" else (batch_size, 3, image_size, image_size)
    batches = []
    for _ in range(steps):
        inputs = torch.randn(shape, generator=generator)
        targets = torch.randint(0, 10, (batch_size,), generator=generator)
        batches.append((inputs.to(device), targets.to(device)))
    return batches


def wrap(variant: str, model: nn.Module, bucket_cap_mb: float | None, device) -> nn.Module:
    """`model` inside DDP or a hand-made version; a cap of None means DDP's default (25 MiB for ours)."""
    if variant == "ddp":
        options = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **options)
    if variant == "bucketed":
        return BucketedDDP(model, 25.0 if bucket_cap_mb is None else bucket_cap_mb)
    return {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP}[variant](model)


# ---------------------------------------------------------------------------- one variant


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_variant(variant, args, info, batches, writer, first_step=0):
    """Train `variant` on `batches` from the seeded initial weights; its step times and final weights."""
    torch.manual_seed(args.seed)  # the same initial weights for every variant
    model = build_model(args.model, args.width, args.depth).to(info.device)
    wrapped = wrap(variant, model, args.bucket_cap_mb, info.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    times, allreduces = [], []
    for step, (inputs, targets) in enumerate(batches, start=1):
        synchronize(info.device)
        start = time.perf_counter()
        loss = F.cross_entropy(wrapped(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP and variants 3-4 all-reduce during this call
        if variant != "ddp":
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
    flat_weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    return times, allreduces, flat_weights, loss.item()


def slowest(value: float, device) -> float:
    """The largest `value` over all ranks: a step is done when its slowest rank is."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.item()


# ---------------------------------------------------------------------------- main


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model options `build_model` reads (shared with inside_ddp.py)."""
    p.add_argument("--model", default="mlp", help="mlp, or a torchvision model such as resnet50")
    p.add_argument("--width", type=int, default=512, help="MLP width (and input features)")
    p.add_argument("--depth", type=int, default=6, help="MLP hidden layers")
    p.add_argument("--image-size", type=int, default=64, help="image side for the ResNets")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}"
    )
    add_model_arguments(p)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the median")
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="bucketed and ddp; default: DDP's")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float, default=None, help="weight check; default 1e-4 (CPU), 1e-3 (GPU)")
    p.add_argument("--atol", type=float, default=None, help="weight check; default 1e-6 (CPU), 1e-5 (GPU)")
    p.add_argument("--run-dir", default=os.environ.get("DDP_RUN_DIR", "runs/handmade_ddp"))
    args = p.parse_args()
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown or not args.variants:
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.steps <= args.warmup_steps:
        p.error("need --steps > --warmup-steps")
    return args


@record
def main():
    args = parse_args()
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
        times, allreduces, weights, final_loss = train_variant(
            variant, args, info, batches, writer, index * args.steps
        )
        reference = weights if reference is None else reference
        max_diff = (weights - reference).abs().max().item()
        matches = torch.allclose(weights, reference, rtol=args.rtol, atol=args.atol)
        all_match = slowest(0.0 if matches else 1.0, info.device) == 0.0  # every rank agrees
        results[variant] = {
            "step_time_s": slowest(statistics.median(times[args.warmup_steps :]), info.device),
            "allreduces_per_step": allreduces[-1] if allreduces else None,
            "max_abs_diff_vs_ddp": slowest(max_diff, info.device),
            "equal_to_ddp": all_match,
            "final_loss": final_loss,
        }
        if info.is_main:
            r = results[variant]
            print(f"{variant:>9}: {r['step_time_s'] * 1e3:8.2f} ms/step, max |w - w_ddp| = "
                  f"{r['max_abs_diff_vs_ddp']:.2e} ({'equal' if all_match else 'DIFFERENT'})", flush=True)  # fmt: skip
        if not all_match:
            raise AssertionError(
                f"{variant}: weights after {args.steps} steps differ from DDP's (max {max_diff:.3e})"
            )
    n_params = sum(p.numel() for p in build_model(args.model, args.width, args.depth).parameters())
    writer.write_summary({
        "world_size": info.world_size, "backend": info.backend, "device": info.device.type,
        "torch_version": torch.__version__, "model": args.model, "parameters": n_params,
        "steps": args.steps, "bucket_cap_mb": args.bucket_cap_mb, "rtol": args.rtol, "atol": args.atol,
        "variants": results,
    })  # fmt: skip
    writer.close()


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
