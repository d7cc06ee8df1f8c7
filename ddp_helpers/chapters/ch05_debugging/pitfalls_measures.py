"""pitfalls.py's measuring: every rank's facts gathered into summary.json, a clock that waits for the
GPU, and the all-reduces one step issues (counted by the profiler).
"""

from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_helpers.run_contract import SUMMARY_FILE, run_dir_from_env, write_json_atomic


def report(rank: int, world: int, **facts: object) -> None:
    """Gather `facts` from every rank; rank 0 writes them, as a list by rank, to summary.json."""
    gathered: list[dict[str, object] | None] = [None] * world
    dist.all_gather_object(gathered, facts)  # every rank must take part
    if rank == 0:
        run_dir = Path(run_dir_from_env("runs/pitfalls"))
        run_dir.mkdir(parents=True, exist_ok=True)
        summary = {"world_size": world, "backend": dist.get_backend(), "ranks": gathered}
        write_json_atomic(run_dir / SUMMARY_FILE, summary)  # the notebook never sees half a file


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so that a clock read measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def all_reduces_per_step(model: DDP, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> dict[str, int]:
    """All-reduces that one training step issues, counted by the profiler: outside Join, then inside it."""

    def count_one_step() -> int:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            optimizer.zero_grad(set_to_none=True)
            model(x).sum().backward()
        optimizer.zero_grad(set_to_none=True)  # a measurement, not a training step
        # c10d::allreduce_ is the dispatcher op every all_reduce goes through, recorded on the calling
        # thread as it is issued. The backend's own range (gloo:all_reduce) ends on gloo's thread, and
        # can end after the profiler has stopped: DDP waits on the bucket's future, which completes first.
        return sum(event.name == "c10d::allreduce_" for event in prof.events())

    counts = {"without Join": count_one_step()}
    with Join([model]):  # every rank is here, so nobody joins early: only the step's own cost is counted
        counts["inside Join"] = count_one_step()
    return counts


def grad_of(param: torch.Tensor) -> torch.Tensor:
    """The gradient that backward() left in `param` (None before: the caller's bug, said so here)."""
    assert param.grad is not None, "no gradient: backward() has not reached this parameter"
    return param.grad
