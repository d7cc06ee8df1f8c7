"""The DDP pitfalls of notebook 05, each one small enough to read in a minute.

    torchrun --nproc-per-node 2 pitfalls.py --case hang            # goes wrong
    torchrun --nproc-per-node 2 pitfalls.py --case hang --fix      # goes right

Cases: crash, hang, monitored_barrier, mismatch, set_epoch, eval, unused, batchnorm, uneven.
Every case works on the CPU with gloo (and on GPUs with nccl).
"""

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from ddp_helpers import teardown

# -----------------------------------------------------------------------------
# the cases: each takes (rank, world_size, device, fix)


def crash(rank, world, device, fix):
    batch = torch.ones(4, device=device)
    divisor = 0 if rank == 1 and not fix else 2  # a bug that only one rank's data triggers
    if divisor == 0:
        raise ZeroDivisionError("rank 1 got an empty shard and divided by its length")
    dist.all_reduce(batch / divisor)
    print(f"rank {rank}: ok")


def hang(rank, world, device, fix):
    x = torch.ones(1, device=device)
    if rank == 1 and not fix:
        print("rank 1: skipping the all_reduce (e.g. an `if loss is nan: continue` on one rank only)")
        time.sleep(3600)  # ...and never reaches the collective that rank 0 waits in
    dist.all_reduce(x)
    print(f"rank {rank}: all_reduce gave {x.item():g}")


def monitored_barrier(rank, world, device, fix):
    if rank == 1 and not fix:
        time.sleep(3600)  # rank 1 is stuck somewhere before the barrier
    # gloo only: unlike barrier(), it reports *which* rank did not arrive
    dist.monitored_barrier(timeout=timedelta(seconds=5))
    print(f"rank {rank}: everyone reached the barrier")


def mismatch(rank, world, device, fix):
    # rank 1 sends a tensor of another shape: without checks this can hang or corrupt data silently
    size = 4 if fix or rank == 0 else 5
    x = torch.ones(size, device=device)
    dist.all_reduce(x)
    print(f"rank {rank}: all_reduce of {size} elements gave {x.tolist()}")


def set_epoch(rank, world, device, fix):
    # not an error, so one run shows both: the wrong loop, then the right one
    for call_set_epoch in (False, True):
        sampler = DistributedSampler(range(32), num_replicas=world, rank=rank, shuffle=True, seed=0)
        for epoch in range(3):
            if call_set_epoch:
                sampler.set_epoch(epoch)  # reseeds the shuffle with seed + epoch
            if rank == 0:
                label = "with set_epoch   " if call_set_epoch else "without set_epoch"
                print(f"{label} epoch {epoch}: rank 0 starts with samples {list(sampler)[:6]}")


def evaluate(rank, world, device, fix):
    # 299 samples and a "model" that is right on exactly the even-numbered ones: 150 of 299
    correct_on = (torch.arange(299) % 2 == 0).float()
    shards = {
        # naive: a DistributedSampler pads 299 up to a multiple of world_size by repeating samples
        "naive (DistributedSampler)": list(
            DistributedSampler(range(299), num_replicas=world, rank=rank, shuffle=False)
        ),  # fmt: skip
        # exact: every sample once (rank::world), with the counts summed across ranks
        "exact (rank::world, summed counts)": list(range(rank, 299, world)),
    }
    for label, shard in shards.items():
        stats = torch.tensor([correct_on[shard].sum().item(), float(len(shard))], device=device)
        dist.all_reduce(stats)
        if rank == 0:
            print(
                f"{label}: accuracy {stats[0].item() / stats[1].item():.6f} over {int(stats[1].item())} samples"
            )


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head_a = nn.Linear(8, 2)
        self.head_b = nn.Linear(8, 2)  # never used in forward: its gradient never arrives

    def forward(self, x):
        return self.head_a(self.body(x))


def unused(rank, world, device, fix):
    # without a fix the second step fails; with --fix, time both fixes
    options = {"plain DDP": {}} if not fix else {
        "find_unused_parameters=True": {"find_unused_parameters": True},  # walks the graph every step
        "static_graph=True": {"static_graph": True},  # learns the unused set once, in the first step
    }  # fmt: skip
    for label, kwargs in options.items():
        torch.manual_seed(0)
        ddp = DDP(TwoHeads().to(device), **kwargs)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        start = time.perf_counter()
        for _ in range(50):
            loss = ddp(torch.randn(16, 8, device=device)).pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"{label}: {(time.perf_counter() - start) / 50 * 1e3:.2f} ms/step")


def batchnorm(rank, world, device, fix):
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(device)
    if fix:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # statistics over the global batch
    ddp = DDP(model)
    # each rank's data has its own mean (rank 0 around 0, rank 1 around 10): a skewed shard
    torch.manual_seed(rank)
    for _ in range(5):
        ddp(torch.randn(32, 4, device=device) + 10 * rank).sum().backward()
    mean = ddp.module[1].running_mean.mean().item()
    print(f"rank {rank}: BatchNorm running mean {mean:.3f}")


def uneven(rank, world, device, fix):
    model = DDP(nn.Linear(4, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = 6 if rank == 0 else 4  # rank 1 runs out of data first
    data = [torch.randn(8, 4, device=device) for _ in range(batches)]

    def train():
        for x in data:
            optimizer.zero_grad(set_to_none=True)
            model(x).sum().backward()  # each backward all-reduces: a rank that has stopped never answers
            optimizer.step()

    if fix:
        with Join([model]):  # finished ranks shadow the others' collectives until all are done
            train()
    else:
        train()
    print(f"rank {rank}: trained on {batches} batches")


CASES = {f.__name__: f for f in (crash, hang, monitored_barrier, mismatch, set_epoch, evaluate, unused,
                                 batchnorm, uneven)}  # fmt: skip


@record
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), required=True)
    p.add_argument("--fix", nargs="?", const="yes", default=None,
                   help="apply the fix (unused: --fix find_unused or --fix static_graph)")  # fmt: skip
    p.add_argument(
        "--pg-timeout", type=float, default=None, help="seconds before a stuck collective errors out"
    )
    args = p.parse_args()
    backend = os.environ.get("DDP_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    if args.case == "monitored_barrier":
        backend = "gloo"  # monitored_barrier exists only on gloo
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=args.pg_timeout) if args.pg_timeout else None
    dist.init_process_group(backend, timeout=timeout)
    CASES[args.case](dist.get_rank(), dist.get_world_size(), device, args.fix)


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
