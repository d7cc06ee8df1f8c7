"""Beyond DDP: where the memory goes, ZeRO-1, FSDP2 (`fully_shard`) and distributed checkpoints.

    torchrun --nproc-per-node 2 fsdp.py --part train            # memory, FSDP2 vs one process, ZeRO-1, bytes
    torchrun --nproc-per-node 2 fsdp.py --part save --checkpoint-dir ckpt
    torchrun --nproc-per-node 3 fsdp.py --part resume --checkpoint-dir ckpt   # 2 ranks saved, 3 load
    torchrun --nproc-per-node 2 fsdp.py --part train save --checkpoint-dir ckpt  # both, one job's start-up

Every rank sees the same global batch of --global-batch samples per step and trains on its own slice,
so a run on N ranks must follow a single process trained on the whole batch: that is the check.
Rank 0 writes what it measured to <run-dir>/summary.json: the first part's results, and those of each
further part under the part's name (summary["save"]).

On torch 2.7 with gloo, FSDP2 sums the gradients over ranks instead of averaging them
(pytorch#162338): `gradient_factor()` measures that on a probe, and `divide_gradients()` fixes it.
"""

import argparse
import inspect
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

try:  # torch >= 2.6 exports FSDP2 here; 2.4-2.5 kept it private
    from torch.distributed.fsdp import FSDPModule, fully_shard
except ImportError:  # pragma: no cover
    from torch.distributed._composable.fsdp import FSDPModule, fully_shard

from ddp_helpers import teardown

FLOAT_BYTES = 4  # fp32 weights, gradients and Adam moments
RTOL, ATOL = 1e-4, 1e-6  # float rounding differs between a sharded and a whole-batch sum


# ---------------------------------------------------------------------------- the model and its data


class BlockMLP(nn.Module):
    """An input layer, `depth` residual blocks, a head: a transformer's layout with Linear blocks."""

    def __init__(self, features: int, width: int, depth: int, classes: int):
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def build_model(args: argparse.Namespace, device: torch.device) -> BlockMLP:
    torch.manual_seed(args.seed)  # the same initial weights on every rank and in the reference
    return BlockMLP(args.features, args.width, args.depth, args.classes).to(device)


def global_batch(args: argparse.Namespace, step: int, device: torch.device):
    """The whole batch of `step`, the same on every rank (a deterministic generator per step)."""
    g = torch.Generator().manual_seed(args.seed * 1000 + step)
    x = torch.randn(args.global_batch, args.features, generator=g)
    y = torch.randint(args.classes, (args.global_batch,), generator=g)
    return x.to(device), y.to(device)


def my_slice(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous share of the global batch (what a DistributedSampler would give)."""
    return tensor.chunk(dist.get_world_size())[dist.get_rank()]


def shard(model: BlockMLP, mesh) -> BlockMLP:
    """FSDP2: each block is one unit (one all-gather, one reduce-scatter), the root holds the rest."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)  # embed and head: gathered once, kept until backward
    return model


# ---------------------------------------------------------------------------- pytorch#162338


def gradient_factor(mesh, device: torch.device) -> float:
    """FSDP2's gradient divided by the true mean, on a probe where the answer is known.

    Every rank's local gradient is all ones, so the mean over ranks is all ones: a correct FSDP2
    gives 1.0; torch 2.7 on gloo gives the world size (it sums: pytorch#162338).
    """
    probe = nn.Linear(1, mesh.size(), bias=False, device=device)
    nn.init.ones_(probe.weight)
    fully_shard(probe, mesh=mesh)
    probe(torch.ones(1, 1, device=device)).sum().backward()  # d(sum)/dW = input = 1 on every rank
    factor = probe.weight.grad.to_local().mean().reshape(1)
    dist.all_reduce(factor, op=dist.ReduceOp.MAX)
    return factor.item()


def divide_gradients(model: nn.Module, factor: float) -> None:
    """Divide every reduce-scatter output by `factor`: FSDP2 calls this hook on each unit's sharded
    gradient right after its reduce-scatter, before the gradient reaches .grad."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_all_reduce_hook(lambda reduced: reduced.div_(factor))


def checked_fsdp(args, mesh, device) -> tuple[BlockMLP, float]:
    """An FSDP2 model whose gradients are the mean over ranks, whichever torch this is."""
    model = shard(build_model(args, device), mesh)
    factor = gradient_factor(mesh, device)
    if mesh.size() > 1 and math.isclose(factor, mesh.size(), rel_tol=1e-6):
        divide_gradients(model, factor)
    elif not math.isclose(factor, 1.0, rel_tol=1e-6):
        raise RuntimeError(f"FSDP2's gradients are {factor}x the mean, not a known bug: stopping")
    return model, factor


# ---------------------------------------------------------------------------- measuring


def local_bytes(tensors) -> int:
    """Bytes this rank holds for `tensors`: a DTensor counts its local shard only."""
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return local_bytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


def memory_row(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    params = list(model.parameters())
    return {
        "weights": local_bytes(params),
        "grads": local_bytes(p.grad for p in params if p.grad is not None),
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

    def __init__(self):
        self.bytes = {"all_gather": 0, "reduce_scatter": 0, "broadcast": 0}
        self.calls = {"all_gather": 0, "reduce_scatter": 0, "broadcast": 0}
        self._depth = 0
        self._originals = {}

    def __enter__(self):
        for name, (kind, index) in self.NAMES.items():
            if hasattr(dist, name):
                self._originals[name] = original = getattr(dist, name)
                setattr(dist, name, self._wrap(original, kind, index))
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(dist, name, original)

    def _wrap(self, original, kind: str, index: int):
        def counted(*args, **kwargs):
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


def timed_steps(step_fn, steps: int, device: torch.device) -> float:
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


# ---------------------------------------------------------------------------- --part train


def train_reference(args, device) -> BlockMLP:
    """A single process on the whole global batch: what every sharded run must equal."""
    model = build_model(args, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        x, y = global_batch(args, step, device)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


def fsdp_versus_one_process(args, mesh, device, result: dict) -> None:
    """FSDP2 gradients and weights against a single process at the global batch."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    model = shard(build_model(args, device), mesh)
    reference = build_model(args, device)
    x, y = global_batch(args, 0, device)
    F.cross_entropy(reference(x), y).backward()
    true_grad = torch.cat([p.grad.flatten() for p in reference.parameters()])

    def fsdp_grad() -> torch.Tensor:
        model.zero_grad()
        F.cross_entropy(model(my_slice(x)), my_slice(y)).backward()  # local mean; FSDP2 averages ranks
        return torch.cat([p.grad.full_tensor().flatten() for p in model.parameters()])

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

    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        xs, ys = global_batch(args, step, device)
        optimizer.zero_grad()
        F.cross_entropy(model(my_slice(xs)), my_slice(ys)).backward()
        optimizer.step()
    trained = torch.cat([p.full_tensor().flatten() for p in model.parameters()])
    expected = torch.cat([p.detach().flatten() for p in train_reference(args, device).parameters()])
    weight_diff = (trained - expected).abs().max().item()
    assert torch.allclose(trained, expected, rtol=RTOL, atol=ATOL), f"FSDP2 weights off by {weight_diff}"
    result["fsdp_vs_one_process"] = {
        "probe_factor": probe,
        "ratio_before_fix": ratio(before),
        "ratio_after_fix": None if fixed is None else ratio(fixed),
        "max_grad_diff": grad_diff,
        "max_grad_diff_before_fix": (before - true_grad).abs().max().item(),
        "max_weight_diff": weight_diff,
        "steps": args.steps,
        "optimizer": "SGD",
        "rtol": RTOL,
        "atol": ATOL,
    }


def adam_run(kind: str, args, mesh, device) -> dict:
    """Train with Adam as DDP, ZeRO-1 or FSDP2: memory per rank, bytes sent and step time."""
    world_size = dist.get_world_size()
    sent = {"all_reduce": 0}
    if kind == "fsdp2":
        model, _ = checked_fsdp(args, mesh, device)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr)
        forward = model
    else:
        model = build_model(args, device)
        ddp = DDP(model, gradient_as_bucket_view=True)  # .grad is a view of the bucket: one copy

        def count_allreduce(state, bucket):
            sent["all_reduce"] += bucket.buffer().numel() * bucket.buffer().element_size()
            buffer = bucket.buffer().div_(world_size)
            return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])

        ddp.register_comm_hook(None, count_allreduce)
        forward = ddp
        if kind == "zero1":  # each rank keeps Adam's state for its own share of the parameters only
            optimizer = ZeroRedundancyOptimizer(
                model.parameters(), optimizer_class=torch.optim.Adam, lr=args.adam_lr
            )
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr)

    def step(n: int) -> None:
        x, y = global_batch(args, n, device)
        optimizer.zero_grad(set_to_none=False)  # keep .grad for the memory count
        F.cross_entropy(forward(my_slice(x)), my_slice(y)).backward()
        optimizer.step()

    step(0)  # Adam creates its state in the first step
    local_state = optimizer.optim if kind == "zero1" else optimizer
    memory = memory_row(model, local_state)
    sent["all_reduce"] = 0
    with CollectiveCounter() as counter:
        step(1)
    one_step = {**counter.bytes, **sent}  # copied now: the timed steps below count on
    seconds = timed_steps(lambda n: step(n + 2), args.timed_steps, device)
    weights = torch.cat(
        [(p.full_tensor() if kind == "fsdp2" else p.detach()).flatten() for p in model.parameters()]
    )
    return {
        "memory": memory,
        "sent_bytes": one_step,
        "calls": counter.calls,
        "step_time_s": seconds,
        "weights": weights,
        "param_tensors": len(list(model.parameters())),
        "state_tensors": len(local_state.state),
    }


def gathered(value: dict) -> list[dict]:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def part_train(args, mesh, device) -> dict:
    world_size = dist.get_world_size()
    result: dict = {"parameters": sum(p.numel() for p in build_model(args, device).parameters())}
    result["padded_parameters"] = padded_numel(build_model(args, device), world_size)
    fsdp_versus_one_process(args, mesh, device, result)
    runs = {}
    for kind in ("ddp", "zero1", "fsdp2"):
        run = adam_run(kind, args, mesh, device)
        runs[kind] = run
        result[kind] = {
            "memory_per_rank": gathered(run["memory"]),
            "sent_bytes": run["sent_bytes"],
            "calls": run["calls"],
            "step_time_s": run["step_time_s"],
            "param_tensors": run["param_tensors"],
            "state_tensors_per_rank": gathered(run["state_tensors"]),
        }
    for kind in ("zero1", "fsdp2"):
        diff = (runs[kind]["weights"] - runs["ddp"]["weights"]).abs().max().item()
        result[kind]["max_weight_diff_vs_ddp"] = diff
        assert torch.allclose(runs[kind]["weights"], runs["ddp"]["weights"], rtol=RTOL, atol=1e-5), (
            f"{kind} weights off DDP's by {diff}"
        )
    result["adam_steps"] = 2 + args.timed_steps
    return result


# ---------------------------------------------------------------------------- --part save / resume


def train_steps(model, optimizer, args, device, steps: range) -> list[float]:
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


def shard_shapes(model: nn.Module) -> dict:
    return {name: list(p.to_local().shape) for name, p in model.named_parameters()}


def part_save(args, mesh, device) -> dict:
    model, factor = checked_fsdp(args, mesh, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr)
    half = args.steps // 2
    before = train_steps(model, optimizer, args, device, range(half))
    # get_state_dict: model and optimizer state keyed by parameter *name*, as DTensors (each rank its shard)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": half}
    start = time.perf_counter()
    dcp.save(state, checkpoint_id=args.checkpoint_dir)  # every rank writes its shards, rank 0 the metadata
    save_s = time.perf_counter() - start
    # the whole model, gathered to rank 0 as plain tensors, to check dcp_to_torch_save in the notebook
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(full, Path(args.run_dir) / "full_model.pt")
    # async_save: copy to CPU now, write in a background thread while training goes on. That thread
    # runs collectives of its own (gathering the plan and metadata): on the training's group they would
    # interleave with the training's and gloo would abort ("collective mismatch"). It gets its own group.
    checkpoint_group = dist.new_group(backend="gloo")
    start = time.perf_counter()
    future = dcp.async_save(
        state, checkpoint_id=args.checkpoint_dir + "-async", process_group=checkpoint_group
    )
    async_return_s = time.perf_counter() - start
    after = train_steps(model, optimizer, args, device, range(half, args.steps))  # runs during the write
    start = time.perf_counter()
    future.result()
    async_wait_s = time.perf_counter() - start
    return {
        "gradient_factor": factor,
        "saved_at_step": half,
        "losses": before + after,
        "shard_shapes": gathered(shard_shapes(model)),
        "save_s": save_s,
        "async_return_s": async_return_s,
        "async_wait_s": async_wait_s,
        "files": sorted(p.name for p in Path(args.checkpoint_dir).iterdir()),
    }


def part_resume(args, mesh, device) -> dict:
    model, factor = checked_fsdp(args, mesh, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr)
    model_state, optim_state = get_state_dict(model, optimizer)  # the shapes to load into
    state = {"model": model_state, "optim": optim_state, "step": 0}
    dcp.load(state, checkpoint_id=args.checkpoint_dir)  # each rank reads the bytes of *its* shards
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    losses = train_steps(model, optimizer, args, device, range(state["step"], args.steps))
    result = {"gradient_factor": factor, "resumed_at_step": state["step"], "losses": losses}
    result["shard_shapes"] = gathered(shard_shapes(model))
    if args.ddp_checkpoint:
        result["ddp_checkpoint"] = load_ddp_checkpoint(args, mesh, device)
    return result


def train_py_mlp(features: int, hidden: int, classes: int) -> nn.Sequential:
    """train.py's --model mlp, layer for layer, so that its state_dict keys (1.weight, ...) match."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Dropout(0.0),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(0.0),
        nn.Linear(hidden, classes),
    )


def load_ddp_checkpoint(args, mesh, device) -> dict:
    """A DDP job's checkpoint (train.py: rank 0 saved the plain model's full state_dict) into FSDP2."""
    plain = torch.load(args.ddp_checkpoint, map_location="cpu", weights_only=True)["model"]
    hidden, features = plain["1.weight"].shape
    classes = plain["7.weight"].shape[0]
    model = train_py_mlp(features, hidden, classes).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # full_state_dict=True: the input is whole tensors; each rank keeps only its shard of each
    # (a copy: set_model_state_dict turns the dict's values into DTensors in place)
    set_model_state_dict(model, dict(plain), options=StateDictOptions(full_state_dict=True))
    back = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    x = torch.randn(args.global_batch, features, generator=torch.Generator().manual_seed(args.seed))
    sharded_out = model(x.to(device)).detach().cpu()
    unsharded = train_py_mlp(features, hidden, classes)
    unsharded.load_state_dict(plain)
    row = {"keys": sorted(plain), "shard_shapes": gathered(shard_shapes(model))}
    if dist.get_rank() == 0:
        row["max_weight_diff"] = max((back[k].cpu() - plain[k]).abs().max().item() for k in plain)
        row["max_output_diff"] = (sharded_out - unsharded(x).detach()).abs().max().item()
        assert row["max_weight_diff"] == 0.0, f"the DDP checkpoint did not load exactly: {row}"
        assert row["max_output_diff"] < 1e-5, f"the sharded model computes something else: {row}"
    return row


# ---------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--part",
        nargs="+",
        choices=("train", "save", "resume"),
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
    p.add_argument("--run-dir", default=os.environ.get("DDP_RUN_DIR", "runs/fsdp"))
    return p.parse_args()


@record
def main():
    args = parse_args()
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    use_cuda = torch.cuda.is_available() and os.environ.get("DDP_BACKEND", "auto") != "gloo"
    device_type = "cuda" if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    world_size = dist.get_world_size()
    if args.global_batch % world_size:
        raise SystemExit(f"--global-batch {args.global_batch} does not split evenly over {world_size} ranks")
    # a 1-D mesh: every rank holds 1/world_size of each parameter
    mesh = init_device_mesh(device_type, (world_size,))
    parts = {"train": part_train, "save": part_save, "resume": part_resume}
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
        (Path(args.run_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"{' + '.join(args.part)}: done on {world_size} rank(s)", flush=True)
    dist.barrier()


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
