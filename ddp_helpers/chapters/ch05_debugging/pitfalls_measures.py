"""pitfalls.py's measuring: a clock that waits for the GPU, and the all-reduces one step issues (counted by
the profiler). Every rank's facts go to summary.json through `ddp_helpers.rank.metrics.report`.
"""

import torch
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


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
