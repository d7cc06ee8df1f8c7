"""The capstone: one plain torchrun script with every line a real DDP training run needs (notebook 10's contract).

torchrun --nproc-per-node 2 capstone.py --data data.pt --out runs/cap --amp fp16 [--stop-at-step 4 | --resume]
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before the process group: ddp.py says why (gloo's threads at exit)
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    """The contract's model: two bias-free layers and dropout (random, so a lost random state shows)."""

    def __init__(self, features: int, hidden: int, classes: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden, bias=False)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.tanh(self.fc1(x))))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train Net with DDP (start it with torchrun).")
    p.add_argument("--data", required=True, help="a .pt file: {x: float32 [N, D], y: int64 [N], classes}")
    p.add_argument("--out", required=True, help="where ckpt.pt goes")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)  # per rank: the global batch is N times it
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--clip", type=float, default=1.0)  # max gradient norm
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--dropout", type=float, default=0.25)
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-at-step", type=int, default=0, help="save and stop after this step, as if killed")
    p.add_argument("--resume", action="store_true", help="continue from <out>/ckpt.pt if there is one")
    return p.parse_args()


def setup() -> tuple[int, int, torch.device]:
    # LOCAL_RANK picks the GPU: RANK counts processes across machines, and cuda:8 does not exist
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # before any CUDA work: NCCL and barrier() use this GPU
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")  # gloo: the CPU backend
    return dist.get_rank(), dist.get_world_size(), device


def random_state(device: torch.device, loader_state: torch.Tensor) -> dict[str, torch.Tensor]:
    # the loader's state as it was before this epoch's iter(loader) drew from it: a resume's iter() redraws
    state = {"cpu": torch.get_rng_state(), "loader": loader_state}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def save(
    path: str,
    raw: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    epoch: int,
    batch: int,
    step: int,
    rank: int,
    world: int,
    device: torch.device,
    loader_state: torch.Tensor,
) -> None:
    # each rank draws its own dropout masks: gather every rank's random state (every rank must call this)
    every: list[dict[str, torch.Tensor] | None] = [None] * world
    dist.all_gather_object(every, random_state(device, loader_state))
    if rank == 0:  # one writer: N ranks writing one file would corrupt it
        ckpt = {
            "model": raw.state_dict(),  # the plain module's: keys without "module."
            "optimizer": optimizer.state_dict(),  # the momentum buffers
            "scaler": scaler.state_dict(),  # the loss scale, after any overflow
            "epoch": epoch,
            "batch": batch,  # batches of this epoch already trained
            "step": step,
            "rng": every,
        }
        tmp = path + ".tmp"
        torch.save(ckpt, tmp)
        os.replace(tmp, path)  # atomic: a reader finds the old file or the new one, never half of one
    dist.barrier()  # no rank runs on (or reads) before the file is whole


def resume(
    path: str | None,
    rank: int,
    device: torch.device,
    raw: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    loader_gen: torch.Generator,
) -> tuple[int, int, int]:
    """Where to go on from: (epoch, batches of it already trained, step). Every rank must call it."""
    # rank 0 chooses: ranks that each looked for themselves could disagree while the file is replaced
    choice = [path if path is not None and os.path.exists(path) else None]
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return 0, 0, 0
    # map_location: onto this rank's device, not the saver's; weights_only: a checkpoint is data
    ckpt = torch.load(choice[0], map_location=device, weights_only=True)
    raw.load_state_dict(ckpt["model"])  # the raw model, before DDP(...) wraps it
    optimizer.load_state_dict(ckpt["optimizer"])
    scaler.load_state_dict(ckpt["scaler"])
    mine = ckpt["rng"][rank]  # this rank's own random state, as it was at the save
    torch.set_rng_state(mine["cpu"].cpu())
    loader_gen.set_state(mine["loader"].cpu())
    if device.type == "cuda":
        torch.cuda.set_rng_state(mine["cuda"].cpu(), device)
    return ckpt["epoch"], ckpt["batch"], ckpt["step"]


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    x: torch.Tensor,
    y: torch.Tensor,
    clip: float,
    amp_dtype: torch.dtype | None,
) -> torch.Tensor:
    with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()  # DDP's all-reduce runs in here
    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    scaler.step(optimizer)  # skipped on every rank when a gradient is inf: they were all-reduced
    scaler.update()
    return loss


def log(loss: torch.Tensor, n: int, step: int, epoch: int, rank: int, device: torch.device) -> None:
    # the mean over every rank's samples: each rank saw only its own batch
    totals = torch.stack([loss.detach().float() * n, torch.tensor(float(n), device=device)])
    dist.all_reduce(totals)  # SUM, then divide: gloo has no ReduceOp.AVG
    if rank == 0:  # one log, not N copies of it
        print(json.dumps({"step": step, "epoch": epoch, "loss": (totals[0] / totals[1]).item()}), flush=True)


def train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> None:
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
    data = torch.load(args.data, weights_only=True)
    dataset = TensorDataset(data["x"], data["y"])
    # a disjoint shard per rank, shuffled
    sampler: DistributedSampler[int] = DistributedSampler(dataset, seed=args.seed)
    # generator=: iter(loader) draws its seed from it, not from the global generator the masks come from
    loader_gen = torch.Generator().manual_seed(args.seed + rank)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, generator=loader_gen)

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    raw = Net(data["x"].shape[1], args.hidden, data["classes"], args.dropout).to(device)
    torch.manual_seed(args.seed + rank)  # from here on each rank draws its own dropout masks
    optimizer = torch.optim.SGD(raw.parameters(), lr=args.lr, momentum=args.momentum)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    # fp16's narrow range: scale the loss so small gradients survive; bf16 has fp32's range and needs none
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")

    path = os.path.join(args.out, "ckpt.pt")
    start_epoch, skip, step = resume(
        path if args.resume else None, rank, device, raw, optimizer, scaler, loader_gen
    )
    # DDP broadcasts rank 0's weights, then averages the gradients during backward()
    model = DDP(raw, device_ids=[device.index] if device.type == "cuda" else None)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank
        # iter(loader) below draws from loader_gen: a resumed epoch must draw what this one draws
        loader_state = loader_gen.get_state()
        for i, (x, y) in enumerate(loader):
            if epoch == start_epoch and i < skip:
                continue  # trained before the stop: the resumed epoch goes on where it stopped
            step += 1
            loss = train_step(model, optimizer, scaler, x.to(device), y.to(device), args.clip, amp_dtype)
            log(loss, len(y), step, epoch, rank, device)
            if step == args.stop_at_step:  # as if the job were killed here, right after a checkpoint
                save(path, raw, optimizer, scaler, epoch, i + 1, step, rank, world, device, loader_state)
                return
    save(path, raw, optimizer, scaler, args.epochs, 0, step, rank, world, device, loader_gen.get_state())


def main() -> None:
    args = parse_args()
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit("start it with torchrun: torchrun --nproc-per-node 2 capstone.py --data D --out O")
    rank, world, device = setup()
    try:
        train(args, rank, world, device)
        dist.barrier()  # every rank ends together: none tears down while another still needs it
    finally:
        teardown()


def teardown() -> None:
    """dist.destroy_process_group(), without the deadlock it can meet on torch 2.7 with gloo (ddp.py says why)."""
    world = dist.group.WORLD  # None only before init_process_group
    gloo = (
        world._get_backend(torch.device("cpu"))
        if world is not None and dist.get_backend() == "gloo"
        else None
    )
    del world  # a handle on the group would keep it, to be freed later with the GIL held
    dist.destroy_process_group()
    del gloo  # the last reference: freed without the GIL


if __name__ == "__main__":
    main()
