"""What handmade_ddp.py and inside_ddp.py share: the model, its batches, the clock and DDP's counters."""

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from ddp_helpers.rank.distributed import DistInfo
from ddp_helpers.run_contract import run_dir_from_env

Batches = list[tuple[torch.Tensor, torch.Tensor]]  # (inputs, targets) for each step


def build_model(name: str, width: int, depth: int, classes: int = 10, batch_norm: bool = False) -> nn.Module:
    """An MLP of `depth` square layers (cheap on the CPU), or a torchvision ResNet (for GPUs)."""
    if name == "mlp":
        layers: list[nn.Module] = []
        for _ in range(depth):
            norm = [nn.BatchNorm1d(width)] if batch_norm else []
            layers += [nn.Linear(width, width), *norm, nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(width, classes))
    import torchvision

    return getattr(torchvision.models, name)(num_classes=classes)


def make_batches(
    model_name: str, width: int, image_size: int, batch_size: int, steps: int, rank: int, device: torch.device
) -> Batches:
    """`steps` batches of this rank's own data (seeded by rank): the same for every variant."""
    generator = torch.Generator().manual_seed(1000 + rank)
    shape = (batch_size, width) if model_name == "mlp" else (batch_size, 3, image_size, image_size)
    batches: Batches = []
    for _ in range(steps):
        inputs = torch.randn(shape, generator=generator)
        targets = torch.randint(0, 10, (batch_size,), generator=generator)
        batches.append((inputs.to(device), targets.to(device)))
    return batches


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def slowest(value: float, device: torch.device) -> float:
    """The largest `value` over all ranks: a step is done when its slowest rank is."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.item()


def median_step_s(step_fn: Callable[[int], object], steps: int, warmup: int, device: torch.device) -> float:
    """The median seconds of `step_fn(0 .. steps - 1)` after `warmup` steps, on the slowest rank."""
    times = []
    for i in range(steps):
        synchronize(device)
        start = time.perf_counter()
        step_fn(i)
        synchronize(device)  # GPU kernels run asynchronously: time them to their end
        times.append(time.perf_counter() - start)
    return slowest(statistics.median(times[warmup:]), device)


def add_arguments(
    p: argparse.ArgumentParser, run_dir: str, batch_help: str = "per rank", steps_help: str = ""
) -> None:
    """The model options `build_model` reads, and a timed run's, with each worker's own help where it differs."""
    p.add_argument("--model", default="mlp", help="mlp, or a torchvision model such as resnet50")
    p.add_argument("--width", type=int, default=512, help="MLP width (and input features)")
    p.add_argument("--depth", type=int, default=6, help="MLP hidden layers")
    p.add_argument("--image-size", type=int, default=64, help="image side for the ResNets")
    p.add_argument("--batch-norm", action="store_true", help="a BatchNorm1d after each MLP layer")
    p.add_argument("--batch-size", type=int, default=32, help=batch_help)
    p.add_argument("--steps", type=int, default=10, help=steps_help or None)
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the median")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default=run_dir_from_env(run_dir))


def make_ddp(
    args: argparse.Namespace, info: DistInfo, cap_mb: float | None = None, **ddp_options: Any
) -> DDP:
    """DDP around the seeded model; `cap_mb` None keeps DDP's default buckets (with its small first one)."""
    if cap_mb is not None:
        ddp_options["bucket_cap_mb"] = cap_mb
    torch.manual_seed(args.seed)  # the same initial weights in every experiment
    model = build_model(args.model, args.width, args.depth).to(info.device)
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(model, device_ids=device_ids, **ddp_options)


def activities(info: DistInfo) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if info.device.type == "cuda" else [])


def count_allreduces(prof: profile) -> int:
    """All-reduces issued in a profiled window: c10d's op is recorded once per call, on any backend."""
    return sum(event.count for event in prof.key_averages() if event.key == "c10d::allreduce_")


def ddp_logging(model: DDP) -> dict:
    """The bucket and timing fields of DDP's own logging data (a private API: guarded)."""
    data = model._get_ddp_logging_data() if hasattr(model, "_get_ddp_logging_data") else {}
    keys = (
        "bucket_cap_bytes",
        "bucket_sizes",
        "has_rebuilt_buckets",
        "num_buckets_reduced",
        "avg_backward_compute_time",
        "avg_backward_comm_time",
        "avg_backward_compute_comm_overlap_time",
    )
    return {key: data[key] for key in keys if key in data}


def gradient_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    with record_function("forward"):
        loss = F.cross_entropy(model(inputs), targets)
    with record_function("backward"):
        loss.backward()  # DDP all-reduces buckets while this runs
    with record_function("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train(
    model: nn.Module, batches: Batches, args: argparse.Namespace, info: DistInfo
) -> tuple[float, float]:
    """Train on `batches`; the median step time after warm-up (slowest rank) and the last loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses = []
    step_s = median_step_s(
        lambda i: losses.append(train_step(model, optimizer, *batches[i])),
        len(batches),
        args.warmup_steps,
        info.device,
    )
    return step_s, losses[-1].item()
