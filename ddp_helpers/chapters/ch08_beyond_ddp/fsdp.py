"""Beyond DDP: where the memory goes, ZeRO-1, FSDP2 (`fully_shard`) and distributed checkpoints.

torchrun --nproc-per-node 2 fsdp.py --part train save --checkpoint-dir ckpt   # then --part resume on 3
"""

import argparse
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record

from ddp_helpers.chapters.ch07_inside_ddp.experiment_kit import median_step_s
from ddp_helpers.chapters.ch08_beyond_ddp import fsdp_checkpoint, fsdp_footprint
from ddp_helpers.chapters.ch08_beyond_ddp.fsdp_model import (
    BlockMLP,
    CollectiveCounter,
    build_model,
    divide_gradients,
    factors_by_reduce,
    flattened,
    gathered,
    global_batch,
    gradient_factor,
    memory_row,
    my_slice,
    shard,
    train_steps,
)
from ddp_helpers.rank import teardown
from ddp_helpers.rank.distributed import worker_backend
from ddp_helpers.run_contract import SUMMARY_FILE, run_dir_from_env, write_json_atomic

__all__ = [
    "BlockMLP",
    "CollectiveCounter",
    "build_model",
    "memory_row",
    "shard",
]  # what notebook 08's live ranks call

RTOL, ATOL = 1e-4, 1e-6  # float rounding differs between a sharded and a whole-batch sum


# ---------------------------------------------------------------------------- --part train


def train_reference(args: argparse.Namespace, device: torch.device) -> BlockMLP:
    """A single process on the whole global batch: what every sharded run must equal."""
    model = build_model(args, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        x, y = global_batch(args, step, device)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


def fsdp_versus_one_process(
    args: argparse.Namespace, mesh: DeviceMesh, device: torch.device, result: dict[str, Any]
) -> None:
    """FSDP2 gradients and weights against a single process at the global batch."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    model = shard(build_model(args, device), mesh)
    reference = build_model(args, device)
    x, y = global_batch(args, 0, device)
    F.cross_entropy(reference(x), y).backward()
    true_grad = flattened(p.grad for p in reference.parameters())

    def fsdp_grad() -> torch.Tensor:
        model.zero_grad()
        F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()  # local mean; FSDP2 averages ranks
        return flattened(p.grad for p in model.parameters())  # FSDP2's gradients are DTensors

    def ratio(grad: torch.Tensor) -> float:  # least-squares factor: grad ~= ratio * true_grad
        return (grad @ true_grad / (true_grad @ true_grad)).item()

    before = fsdp_grad()
    probe = gradient_factor(mesh, device)
    fixed = None
    if world_size > 1 and math.isclose(probe, world_size, rel_tol=1e-6):
        print(
            f"[rank {rank}] pytorch#162338: FSDP2 summed the gradients ({probe:g}x the mean); dividing",
            flush=True,
        )
        divide_gradients(model, probe)
        fixed = fsdp_grad()
    grad = before if fixed is None else fixed
    grad_diff = (grad - true_grad).abs().max().item()
    assert torch.allclose(grad, true_grad, rtol=RTOL, atol=ATOL), f"FSDP2 gradients off by {grad_diff}"

    train_steps(model, torch.optim.SGD(model.parameters(), lr=args.lr), args, device, range(args.steps))
    trained = flattened(model.parameters())
    expected = torch.cat([p.detach().flatten() for p in train_reference(args, device).parameters()])
    weight_diff = (trained - expected).abs().max().item()
    assert torch.allclose(trained, expected, rtol=RTOL, atol=ATOL), f"FSDP2 weights off by {weight_diff}"
    result["fsdp_vs_one_process"] = {
        "probe_factor": probe,
        "factor_by_reduce": factors_by_reduce(mesh, device),
        "ratio_before_fix": ratio(before),
        "ratio_after_fix": None if fixed is None else ratio(fixed),
        "max_grad_diff": grad_diff,
        "max_grad_diff_before_fix": (before - true_grad).abs().max().item(),
        "max_weight_diff": weight_diff,
        "steps": args.steps,
    }


def adam_run(
    kind: str, args: argparse.Namespace, mesh: DeviceMesh, device: torch.device
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Train with Adam as ddp, zero1, zero2 or fsdp2: the weights, and memory per rank, bytes sent, step time."""
    forward, model, optimizer, buckets = fsdp_footprint.wrapped(kind, "fp32", args, mesh, device)

    def step(n: int) -> None:
        x, y = global_batch(args, n, device)
        optimizer.zero_grad(set_to_none=False)  # keep .grad for the memory count
        F.cross_entropy(forward(my_slice(x)), my_slice(y)).backward()
        optimizer.step()

    step(0)  # Adam creates its state in the first step
    local_state = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer: this rank's Adam
    memory = memory_row(model, local_state, buckets)
    params = list(model.parameters())
    # which parameters this rank keeps optimizer state for (ZeRO-1: its own share only)
    state_params = [i for i, p in enumerate(params) if p in local_state.state]
    first_step = len(buckets)
    with CollectiveCounter() as counter:
        step(1)
    all_reduced = sum(b.nbytes for b in buckets[first_step:])  # DDP's all-reduces: one per bucket
    seconds = median_step_s(lambda n: step(n + 2), args.timed_steps, 1, device)  # after one warm-up
    return flattened(p.detach() for p in params), {
        "memory_per_rank": gathered(memory),
        "sent_bytes": {**counter.bytes, "all_reduce": all_reduced},
        "calls": counter.calls,
        "step_time_s": seconds,
        "param_tensors": len(params),
        "state_params_per_rank": gathered(state_params),
    }


def part_train(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> dict[str, Any]:
    result: dict = {"parameters": sum(p.numel() for p in build_model(args, device).parameters())}
    fsdp_versus_one_process(args, mesh, device, result)
    weights = {}
    for kind in ("ddp", "zero1", "zero2", "fsdp2"):
        weights[kind], result[kind] = adam_run(kind, args, mesh, device)
    for kind in ("zero1", "zero2", "fsdp2"):
        diff = (weights[kind] - weights["ddp"]).abs().max().item()
        result[kind]["max_weight_diff_vs_ddp"] = diff
        assert torch.allclose(weights[kind], weights["ddp"], rtol=RTOL, atol=1e-5), (
            f"{kind} weights off DDP's by {diff}"
        )
    return result


# ---------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--part",
        nargs="+",
        choices=("train", "save", "resume", "peak"),
        default=["train"],
        help="one part, or several run one after the other in this job",
    )
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--width", type=int, default=256, help="each block is one width x width Linear")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=24, help="divisible by 1, 2, 3, 4, 6 and 8 ranks")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--timed-steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.05, help="SGD's, for the check against one process")
    p.add_argument("--adam-lr", type=float, default=1e-3, help="Adam's, everywhere else")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default="runs/fsdp-ckpt")
    p.add_argument("--ddp-checkpoint", default=None, help="a train.py checkpoint to load into FSDP2")
    p.add_argument(
        "--saved-full", default=None, help="--part resume: the saving job's full_model.pt, to check the load"
    )
    p.add_argument("--run-dir", default=run_dir_from_env("runs/fsdp"))
    return p.parse_args()


def refuse_uneven_batch(global_batch: int, world_size: int) -> None:
    """Exit, saying why, where `world_size` ranks cannot split `global_batch` evenly."""
    if global_batch % world_size:
        raise SystemExit(
            f"--global-batch {global_batch} does not split evenly over {world_size} ranks: pass a multiple "
            f"of {world_size} (notebook 08's plan picks one for every world)"
        )


@record
def main() -> None:
    args = parse_args()
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    backend, device_type = worker_backend()  # the launcher's choice; gloo where GPUs are too few
    use_cuda = device_type == "cuda"
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    world_size = dist.get_world_size()
    refuse_uneven_batch(args.global_batch, world_size)
    # a 1-D mesh: every rank holds 1/world_size of each parameter
    mesh = init_device_mesh(device_type, (world_size,))
    parts = {
        "train": part_train,
        "save": fsdp_checkpoint.part_save,
        "resume": fsdp_checkpoint.part_resume,
        "peak": fsdp_footprint.part_peak,
    }
    first, *others = args.part
    result = parts[first](args, mesh, device)
    for name in others:  # a further part in the same job: no second start-up and rendezvous to pay
        result[name] = parts[name](args, mesh, device)
    if dist.get_rank() == 0:
        summary = {
            "part": first,
            "world_size": world_size,
            "backend": dist.get_backend(),
            "device": device_type,
            "torch_version": torch.__version__,
            **result,
        }
        write_json_atomic(Path(args.run_dir) / SUMMARY_FILE, summary)  # never half a file
        print(f"{' + '.join(args.part)}: done on {world_size} rank(s)", flush=True)
    dist.barrier()


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
