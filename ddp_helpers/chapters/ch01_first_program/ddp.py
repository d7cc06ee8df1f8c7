"""single_device.py made DDP: one process per device, started by torchrun. Torch only: copy it anywhere.

torchrun --nproc-per-node 2 ddp.py --epochs 3
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  imported before init_process_group, or gloo can abort at exit
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_dataset(size: int = 2048, features: int = 20, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Points around one centre per class: built from a seed, so no download and the same everywhere."""
    gen = torch.Generator().manual_seed(seed)
    centres = 2 * torch.randn(classes, features, generator=gen)
    labels = torch.randint(classes, (size,), generator=gen)
    return TensorDataset(centres[labels] + torch.randn(size, features, generator=gen), labels)


def train(args: argparse.Namespace, device: torch.device) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    dataset = make_dataset()
    sampler: DistributedSampler[int] = DistributedSampler(dataset)  # a disjoint shard per rank, shuffled
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model: nn.Module = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    # DDP copies rank 0's weights to every rank, then averages gradients during backward()
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # index = LOCAL_RANK
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # without it, every epoch repeats the first one's shuffle
        totals = torch.zeros(2, device=device)  # the epoch's summed loss and its sample count
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(y), torch.tensor(len(y), device=device)])
        # each rank saw its own shard: sum every rank's totals, or rank 0 reports its shard alone
        dist.all_reduce(totals)  # SUM, then divide: gloo on torch 2.7 has no ReduceOp.AVG
        # every rank: where its own shard of this epoch's shuffle starts (no two ranks' shards overlap). On one
        # terminal the ranks' lines can run together; torchrun --tee 3 prefixes and separates them
        print(f"rank {rank} drew samples {list(sampler)[:4]} first")
        if rank == 0:  # one process prints the loss: N copies of one line help nobody
            print(
                f"epoch {epoch}: loss {totals[0] / totals[1]:.4f} (mean over {int(totals[1])} samples)",
                flush=True,
            )

    if rank == 0:  # one writer: N processes writing one file would corrupt it
        torch.save(model.module.state_dict(), args.save)  # .module: the plain model, no "module." prefix
        print(f"saved {args.save}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a small classifier with DDP (start with torchrun).")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)  # per process: the global batch is N times it
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        parser.error(
            "start it with torchrun, which sets RANK and LOCAL_RANK: torchrun --nproc-per-node 2 ddp.py"
        )

    # torchrun starts one process per device and tells each who it is. LOCAL_RANK numbers the
    # processes on this machine: it picks the GPU (RANK counts across machines: cuda:8 won't exist).
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):  # a GPU for every process
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # before init: this process's NCCL work and barrier() go to its GPU
        dist.init_process_group("nccl", device_id=device)  # device_id: NCCL connects now, not at first use
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")  # gloo connects every pair of ranks here
    try:
        train(args, device)
        dist.barrier()  # every rank ends together: the others wait here until rank 0's file is whole
    finally:
        teardown()


def teardown() -> None:
    """dist.destroy_process_group(), without the deadlock it can meet on torch 2.7 with gloo."""
    # torch < 2.8 with gloo can deadlock in the destroy (pytorch/pytorch#154976): holding gloo's backend
    # until the group is gone avoids it (notebooks/deeper/01_process_group_and_teardown.ipynb says how)
    world = dist.group.WORLD  # None only before init_process_group
    gloo = (
        world._get_backend(torch.device("cpu"))
        if world is not None and dist.get_backend() == "gloo"
        else None
    )
    del world  # a handle on the group would keep it, to be freed later with the GIL held
    dist.destroy_process_group()
    del gloo  # the last reference: gloo's threads end here, with the GIL released


if __name__ == "__main__":
    main()
