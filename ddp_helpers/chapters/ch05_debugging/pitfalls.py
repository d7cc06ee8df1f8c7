"""The DDP pitfalls of notebook 05, each small enough to read in a minute; a case that measures writes summary.json.

torchrun --nproc-per-node 2 pitfalls.py --case hang [--fix]
"""

import argparse
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from ddp_helpers.rank import teardown
from ddp_helpers.rank.distributed import setup_distributed
from ddp_helpers.rank.metrics import report

WARMUP_STEPS = 5  # steps left out of a timing: the first ones set up buckets and caches
TIMED_STEPS = 50  # steps timed: enough to average out the scheduler's noise on a busy CPU

# -----------------------------------------------------------------------------
# measuring: a clock that waits for the GPU


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so that a clock read measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -----------------------------------------------------------------------------
# the cases: each takes (rank, world_size, device, fix)


def crash(rank: int, world: int, device: torch.device, fix: bool) -> None:
    batch = torch.ones(4, device=device)
    divisor = 0 if rank == 1 and not fix else 2  # a bug that only one rank's data triggers
    if divisor == 0:
        raise ZeroDivisionError("rank 1 got an empty shard and divided by its length")
    dist.all_reduce(batch / divisor)
    print(f"rank {rank}: ok")


def hang(rank: int, world: int, device: torch.device, fix: bool) -> None:
    x = torch.ones(1, device=device)
    if rank == 1 and not fix:
        print("rank 1: skipping the all_reduce (e.g. an `if loss is nan: continue` on one rank only)")
        time.sleep(3600)  # ...and never reaches the collective that the other ranks wait in
    print(f"rank {rank}: waiting in all_reduce")
    dist.all_reduce(x)
    print(f"rank {rank}: all_reduce gave {x.item():g}")


def monitored_barrier(rank: int, world: int, device: torch.device, fix: bool) -> None:
    if rank == 1 and not fix:
        time.sleep(3600)  # rank 1 is stuck somewhere before the barrier
    # gloo only: unlike barrier(), rank 0 reports *which* rank did not arrive. The other ranks
    # wait longer than rank 0, so that rank 0's report is the first failure. Rank 0's 2 s are ample: the
    # other ranks reach the barrier straight after init_process_group.
    dist.monitored_barrier(timeout=timedelta(seconds=2 if rank == 0 else 60))
    print(f"rank {rank}: everyone reached the barrier")


def mismatch(rank: int, world: int, device: torch.device, fix: bool) -> None:
    # rank 1 sends a tensor of another shape: without checks this can hang or corrupt data silently
    size = 4 if fix or rank != 1 else 5
    x = torch.ones(size, device=device)
    print(f"rank {rank}: all-reducing {size} elements")
    dist.all_reduce(x)
    print(f"rank {rank}: all_reduce of {size} elements gave {x.tolist()}")
    report(rank, world, values=x.tolist())


def set_epoch(rank: int, world: int, device: torch.device, fix: bool) -> None:
    # not an error, so one run shows both: the wrong loop, then the right one
    orders: dict[str, list[list[int]]] = {}
    for call_set_epoch in (False, True):
        label = "with set_epoch" if call_set_epoch else "without set_epoch"
        # torch types `dataset` as a Dataset; a sampler only takes its len(), so a range serves
        sampler = DistributedSampler(range(32), num_replicas=world, rank=rank, shuffle=True, seed=0)  # type: ignore[arg-type, var-annotated]
        orders[label] = []
        for epoch in range(3):
            if call_set_epoch:
                sampler.set_epoch(epoch)  # reseeds the shuffle with seed + epoch
            orders[label].append(list(sampler))
            if rank == 0:
                print(f"{label:<17} epoch {epoch}: rank 0 starts with samples {orders[label][-1][:6]}")
    report(rank, world, orders=orders)


def evaluate(rank: int, world: int, device: torch.device, fix: bool) -> None:
    # 299 samples and a "model" that is right on exactly the even-numbered ones: 150 of 299
    correct_on = (torch.arange(299) % 2 == 0).float()
    shards = {
        # naive: a DistributedSampler pads 299 up to a multiple of world_size by repeating samples
        # (torch types `dataset` as a Dataset: a sampler only takes its len(), so a range serves)
        "naive": list(DistributedSampler(range(299), num_replicas=world, rank=rank, shuffle=False)),  # type: ignore[arg-type]
        # exact: every sample once (rank::world), with the counts summed across ranks
        "exact": list(range(rank, 299, world)),
    }
    results = {}
    for label, shard in shards.items():
        stats = torch.tensor([correct_on[shard].sum().item(), float(len(shard))], device=device)
        dist.all_reduce(stats)
        results[label] = {"correct": stats[0].item(), "counted": int(stats[1].item())}
        if rank == 0:
            accuracy = stats[0].item() / stats[1].item()
            print(f"{label}: accuracy {accuracy:.6f} over {int(stats[1].item())} samples")
    report(rank, world, **results)


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head_a = nn.Linear(8, 2)
        self.head_b = nn.Linear(8, 2)  # never used in forward: its gradient never arrives

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_a(self.body(x))


def unused(rank: int, world: int, device: torch.device, fix: bool) -> None:
    if fix:
        time_unused_fixes(rank, world, device)
        return
    # plain DDP: which step fails, where, and had the replicas already drifted apart by then?
    torch.manual_seed(0)  # the same initial weights on every rank
    ddp = DDP(TwoHeads().to(device))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)  # each rank its own batches, as under a DistributedSampler
    failed_at, phase, error, step1 = None, None, None, {}
    for step in (1, 2):
        phase = "forward"
        try:
            x = torch.randn(16, 8, device=device)
            loss = ddp(x).pow(2).mean()
            phase = "backward"
            optimizer.zero_grad(set_to_none=True)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                loss.backward()  # head_b's gradient never comes, so its bucket is never all-reduced
        except RuntimeError as err:
            failed_at, error = step, str(err).splitlines()[0]
            break
        if step == 1:  # what step 1's backward did to body's gradient: all-reduced, or this rank's own?
            own = ddp.module.body.weight
            local = torch.autograd.grad(ddp.module(x).pow(2).mean(), own)[0]  # no DDP: this rank only
            step1 = {
                "allreduces": sum(event.name == "c10d::allreduce_" for event in prof.events()),
                "grad_minus_local": (own.grad - local).abs().max().item(),
            }
        optimizer.step()
        print(f"rank {rank}: step {step} ran without an error")
    print(f"rank {rank}: step {failed_at} failed in the {phase}: {error}")
    # after step 1: do the replicas still agree? compare every rank's body weights with rank 0's
    weights = ddp.module.body.weight.detach().clone()
    rank0 = weights.clone()
    dist.broadcast(rank0, src=0)
    report(
        rank,
        world,
        failed_at_step=failed_at,
        phase=phase,
        error=error,
        step1_allreduces=step1.get("allreduces"),
        step1_grad_minus_local=step1.get("grad_minus_local"),
        gap_to_rank0=(weights - rank0).abs().max().item(),
    )


def time_unused_fixes(rank: int, world: int, device: torch.device) -> None:
    # the two fixes, timed after a warm-up: the first steps build buckets, caches and (static_graph)
    # the unused set, and are not what every later step costs
    options: dict[str, dict[str, Any]] = {  # DDP's keywords
        "find_unused_parameters=True": {"find_unused_parameters": True},  # walks the graph every step
        "static_graph=True": {"static_graph": True},  # learns the unused set once, in the first step
    }
    timings, gaps = {}, {}
    for label, kwargs in options.items():
        torch.manual_seed(0)
        ddp = DDP(TwoHeads().to(device), **kwargs)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        torch.manual_seed(1 + rank)  # each rank its own batches: only averaging keeps the replicas equal
        for step in range(WARMUP_STEPS + TIMED_STEPS):
            if step == WARMUP_STEPS:
                synchronize(device)
                start = time.perf_counter()
            loss = ddp(torch.randn(16, 8, device=device)).pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        synchronize(device)  # GPU work is asynchronous: wait for it before reading the clock
        timings[label] = (time.perf_counter() - start) / TIMED_STEPS * 1e3
        # the fix must average every gradient: each replica ends with rank 0's weights
        weights = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
        rank0 = weights.clone()
        dist.broadcast(rank0, src=0)
        gaps[label] = (weights - rank0).abs().max().item()
        if rank == 0:
            print(
                f"{label}: {timings[label]:.2f} ms/step over {TIMED_STEPS} steps after {WARMUP_STEPS} warm-up"
            )
    report(rank, world, ms_per_step=timings, gap_to_rank0=gaps)


def batchnorm(rank: int, world: int, device: torch.device, fix: bool) -> None:
    model = nn.Sequential(nn.BatchNorm1d(4)).to(device)
    if fix:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # statistics over the global batch
    ddp = DDP(model)  # broadcast_buffers=True (the default): rank 0's buffers go to all before each forward
    norm = ddp.module[0]
    seen: dict[str, list[float]] = {}
    # runs inside DDP's forward, after DDP has broadcast the buffers and before BatchNorm updates them
    norm.register_forward_pre_hook(lambda module, args: seen.update(start=module.running_mean.tolist()))
    # each rank's data has its own mean (rank r around 10 r): skewed shards
    torch.manual_seed(rank)
    batches = [torch.randn(32, 4, device=device) + 10 * rank for _ in range(5)]
    for x in batches:
        out = ddp(x)
        out.sum().backward()
    print(
        f"rank {rank}: input mean {x.mean().item():7.3f}, output mean {out.mean().item():7.3f}, "
        f"running mean {norm.running_mean.mean().item():7.3f}"
    )

    # what a plain BatchNorm would have kept: fed this rank's batches only, or every rank's
    everyone = [torch.empty_like(torch.stack(batches)) for _ in range(world)]
    dist.all_gather(everyone, torch.stack(batches))
    own, whole = nn.BatchNorm1d(4).to(device), nn.BatchNorm1d(4).to(device)
    for step, batch in enumerate(batches):
        own(batch)
        whole(torch.cat([shard[step] for shard in everyone]))
    assert own.running_mean is not None and whole.running_mean is not None  # they track statistics
    report(
        rank,
        world,
        input_mean=x.mean().item(),
        output_mean=out.mean(dim=0).tolist(),
        running_mean_at_forward=seen["start"],
        running_mean=norm.running_mean.tolist(),
        own_data_running_mean=own.running_mean.tolist(),
        global_data_running_mean=whole.running_mean.tolist(),
    )


def uneven(rank: int, world: int, device: torch.device, fix: bool) -> None:
    model = DDP(nn.Linear(4, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = 6 if rank == 0 else 4  # the other ranks run out of data first
    data = [torch.randn(8, 4, device=device) for _ in range(batches)]
    print(f"rank {rank}: {batches} batches to train on")
    scaled = []  # each step's all-reduced gradient over this rank's own local one

    def train() -> None:
        for x in data:
            local = torch.autograd.grad(model.module(x).sum(), model.module.weight)[
                0
            ]  # no DDP: this rank only
            optimizer.zero_grad(set_to_none=True)
            model(x).sum().backward()  # each backward all-reduces: a rank that has stopped never answers
            scaled.append((model.module.weight.grad / local).mean().item())
            optimizer.step()

    if fix:
        with Join([model]):  # finished ranks shadow the others' collectives until all are done
            train()
        report(rank, world, grad_over_local=scaled)
    else:
        train()
    # .item() waits for the GPU: on NCCL the collectives run asynchronously, and only this line
    # shows whether they ever finished
    print(f"rank {rank}: trained on {batches} batches, weight sum {model.module.weight.sum().item():.4f}")


def slow_save(rank: int, world: int, device: torch.device, fix: bool, save_seconds: float) -> None:
    # rank 0 writes a checkpoint (here: sleeps as long as a big save takes) while the others
    # wait at the barrier after it, and a barrier waits at most the process group's timeout
    save_ended = None
    if rank == 0:
        print(f"rank 0: saving a checkpoint, {save_seconds:g} s")
        time.sleep(save_seconds)
        save_ended = time.time()
    else:
        print(f"rank {rank}: waiting at the barrier for rank 0's save")
    entered = time.time()
    dist.barrier()
    print(f"rank {rank}: past the barrier")
    # one machine, one clock: when each rank reached and left the barrier, and when rank 0's save ended
    report(rank, world, entered=entered, left=time.time(), save_ended=save_ended)


def oom(rank: int, world: int, device: torch.device, fix: bool) -> None:
    if device.type != "cuda":
        # an exception, not SystemExit: @record writes it to the error file, and the launcher shows it
        raise RuntimeError(
            "the oom case needs a GPU: on the CPU the kernel's OOM killer ends the process instead"
        )
    if rank == 0:
        total = torch.cuda.get_device_properties(device).total_memory
        kept = torch.empty(2**28, dtype=torch.uint8, device=device)  # 256 MiB that stays allocated
        try:
            torch.empty(2 * total, dtype=torch.uint8, device=device)  # twice the whole GPU
        except torch.OutOfMemoryError as err:
            first_line = str(err).splitlines()[0]
            print("OutOfMemoryError:", first_line)
            print(torch.cuda.memory_summary(device, abbreviated=True))
            report_oom = {
                "error": first_line,
                "total": total,
                "allocated": torch.cuda.memory_allocated(device),
                "reserved": torch.cuda.memory_reserved(device),
                "kept": kept.numel(),
            }
        else:
            report_oom = {"error": None}
    else:
        report_oom = {}
    report(rank, world, **report_oom)


# the lesson's cases, then its companion's
CASES: dict[str, Callable[..., None]] = {f.__name__: f for f in (crash, hang, set_epoch, evaluate, unused)}
CASES |= {f.__name__: f for f in (monitored_barrier, mismatch, batchnorm, uneven, slow_save, oom)}


@record
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), required=True)
    p.add_argument("--fix", action="store_true", help="apply the fix")
    p.add_argument(
        "--pg-timeout", type=float, default=None, help="seconds before a stuck collective errors out"
    )
    p.add_argument("--save-seconds", type=float, default=3.0, help="slow_save: how long rank 0's save takes")
    args = p.parse_args()
    # monitored_barrier exists only on gloo; everything else uses the launcher's choice.
    # On GPUs setup_distributed sets the device and passes device_id, so NCCL connects at once and its
    # watchdog (and Flight Recorder) exists before the first collective.
    backend = "gloo" if args.case == "monitored_barrier" else None
    timeout = timedelta(seconds=args.pg_timeout) if args.pg_timeout else None
    info = setup_distributed(backend=backend, timeout=timeout)
    if not info.distributed:
        raise SystemExit(
            "run the pitfalls under torchrun: torchrun --nproc-per-node 2 pitfalls.py --case ..."
        )
    if info.world_size < 2 and args.case != "oom":
        raise ValueError(f"the {args.case} case needs two ranks or more; this run has {info.world_size}")
    extra = {"save_seconds": args.save_seconds} if args.case == "slow_save" else {}
    CASES[args.case](info.rank, info.world_size, info.device, args.fix, **extra)


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
