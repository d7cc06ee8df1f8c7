"""Right answers written differently from the references pass: the checker judges what an answer does, not
how it is spelled. Each is an answer a learner wrote in their own words (issue 60), run on real live ranks."""

from __future__ import annotations

import pytest

from ddp_helpers import start_ranks
from ddp_helpers.kernel.exercises.checker import check

pytestmark = pytest.mark.xdist_group("test_right_answers")

RIGHT_ANSWERS = {
    "00-sum, every rank's value gathered, then added, in float32": (
        "00-sum",
        """
parts = [torch.zeros(1, device=device) for _ in range(world_size)]
dist.all_gather(parts, torch.tensor([float(value)], device=device))
total = torch.cat(parts).sum()
""",
    ),
    "06-init, the rank from dist.get_rank() after init, as most tutorials write it": (
        "06-init",
        """
def init_distributed(env):
    local_rank = int(env["LOCAL_RANK"])
    on_gpus = torch.cuda.is_available()
    if on_gpus:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if on_gpus else "gloo")
    device = torch.device(f"cuda:{local_rank}") if on_gpus else torch.device("cpu")
    return device, (dist.get_rank(), dist.get_world_size())
""",
    ),
    "07-accumulate, one loop with a context chosen per micro-batch": (
        "07-accumulate",
        """
import contextlib

k = len(micro_batches)
for i, x in enumerate(micro_batches):
    last = i == k - 1
    with contextlib.nullcontext() if last else ddp_model.no_sync():
        (ddp_model(x).sum() / k).backward()
optimizer.step()
optimizer.zero_grad()
""",
    ),
    "05-nan-skip, a MAX of Python-tested flags": (
        "05-nan-skip",
        """
import math

for x in batches:
    optimizer.zero_grad(set_to_none=True)
    loss = ddp_model(x).sum()
    loss.backward()
    flag = torch.tensor([float(not math.isfinite(loss.item()))], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() == 0.0:
        optimizer.step()
""",
    ),
    "05-first-bad, a loop over steps, then ranks": (
        "05-first-bad",
        """
gathered = [None] * world_size
dist.all_gather_object(gathered, losses)
first_bad = None
for step in range(len(losses)):
    bad_ranks = [r for r in range(world_size) if not math.isfinite(gathered[r][step])]
    if bad_ranks:
        first_bad = (step, bad_ranks[0])
        break
""",
    ),
    "04-save, the random states gathered to rank 0 alone (only rank 0 needs them)": (
        "04-save",
        """
import os

mine = {"torch": torch.get_rng_state(), "loader": generator_at_epoch_start}
states = [None] * world_size if rank == 0 else None
dist.gather_object(mine, states, dst=0)
if rank == 0:
    ckpt = {
        "model": ddp_model.module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": epoch,
        "batch_in_epoch": batch_in_epoch,
        "rng": states,
    }
    tmp = path + ".tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)
dist.barrier()
""",
    ),
    "09-last-batch, the short batch padded and only its real rows in the loss": (
        "09-last-batch",
        """
sampler = DistributedSampler(dataset, shuffle=False)
loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
seen = torch.zeros((), dtype=torch.int64, device=device)
for (x,) in loader:
    x = x.to(device)
    real = len(x)
    x = torch.nn.functional.pad(x, (0, 0, 0, batch_size - real))  # one shape: one compile
    ddp_model(x)[:real].sum().backward()  # the padding rows weigh nothing
    seen += real
dist.all_reduce(seen)
samples = int(seen)
""",
    ),
    # at 3 ranks the checker runs 01 and 04-save as 2 nodes (ranks 0 and 1 on node 0, rank 2 on node 1): an
    # answer that takes its rank from the process group, not from `rank`, is as right as the reference
    "01-shard, rank and num_replicas given, from the process group": (
        "01-shard",
        """
sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), seed=seed)
loader = DataLoader(dataset, batch_size=2, sampler=sampler)
for epoch in range(first_epoch, first_epoch + epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        train_step(x, y)
""",
    ),
    "01-wrap, the one writer chosen with dist.get_rank()": (
        "01-wrap",
        """
ddp_model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])] if device.type == "cuda" else None)
opt = torch.optim.SGD(ddp_model.parameters(), lr=1.0)
for _ in range(steps):
    opt.zero_grad()
    ddp_model(x).sum().backward()
    opt.step()
if dist.get_rank() == 0:
    torch.save(ddp_model.module.state_dict(), save_path)
""",
    ),
    "04-save, the writer from os.environ's RANK": (
        "04-save",
        """
mine = {"torch": torch.get_rng_state(), "loader": generator_at_epoch_start}
states = [None] * world_size
dist.all_gather_object(states, mine)
if int(os.environ["RANK"]) == 0:
    ckpt = {
        "model": ddp_model.module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": epoch,
        "batch_in_epoch": batch_in_epoch,
        "rng": states,
    }
    torch.save(ckpt, path + ".new")
    os.replace(path + ".new", path)
dist.barrier()
""",
    ),
    "06-init, torchrun's variables read from os.environ, as a script reads them": (
        "06-init",
        """
def init_distributed(env):
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device, (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
""",
    ),
    "06-main, the world size from dist.get_world_size() (main runs after start-up), try/except/else": (
        "06-main",
        """
def main(env):
    lr = base_lr * dist.get_world_size()
    torch.random.manual_seed(seed)
    model = build_model()
    try:
        train(model, lr)
    except BaseException:
        raise
    else:
        dist.barrier()
    finally:
        dist.destroy_process_group()
""",
    ),
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    with start_ranks(nproc=3, run_dir=tmp_path_factory.mktemp("ranks")) as live:
        yield live


@pytest.mark.parametrize("case", list(RIGHT_ANSWERS))
def test_a_right_answer_written_differently_passes(case, ranks, tmp_path):
    exercise, answer = RIGHT_ANSWERS[case]
    verdict = check(exercise, answer.lstrip("\n"), ranks, workdir=tmp_path)
    assert verdict.passed, verdict.text()
