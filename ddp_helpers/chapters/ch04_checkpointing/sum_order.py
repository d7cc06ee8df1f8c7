"""Why a resumed run can differ in the last bit from 3 ranks on: DDP's rebuilt buckets sum in another layout.

torchrun --nproc-per-node 3 sum_order.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_helpers.rank import teardown
from ddp_helpers.rank.distributed import setup_distributed
from ddp_helpers.rank.metrics import report
from ddp_helpers.run_contract import RUN_DIR_ENV


def grad_of(param: torch.Tensor) -> torch.Tensor:
    """The gradient that backward() left in `param` (None before: the caller's bug, said so here)."""
    assert param.grad is not None, "no gradient: backward() has not reached this parameter"
    return param.grad


def sum_order(rank: int, world: int, device: torch.device) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(
        device
    )
    ddp = DDP(model)
    params = list(model.parameters())
    torch.manual_seed(1 + rank)
    x, y = torch.randn(32, 64, device=device), torch.randint(0, 10, (32,), device=device)
    with ddp.no_sync():  # this rank's own gradients, not all-reduced
        nn.functional.cross_entropy(ddp(x), y).backward()
    local = [grad_of(p).clone() for p in params]
    steps = []
    for _ in range(3):  # three steps on the same batch and the same weights (no optimizer step)
        ddp.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(x), y).backward()
        steps.append(torch.cat([grad_of(p).flatten() for p in params]))
    rebuilt = ddp._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices", "")

    def all_reduced(order: list[int]) -> torch.Tensor:
        """DDP's sum by hand: each gradient times 1/world, flat in `order`, all-reduced."""
        flat = torch.cat([local[i].flatten() * (1.0 / world) for i in order])
        dist.all_reduce(flat)
        parts = dict(zip(order, flat.split([local[i].numel() for i in order]), strict=True))
        return torch.cat([parts[i] for i in range(len(params))])

    param_order, ready_order = list(range(len(params))), list(reversed(range(len(params))))
    in_param_order, in_ready_order = all_reduced(param_order), all_reduced(ready_order)
    report(
        rank,
        world,
        first_equals_second=torch.equal(steps[0], steps[1]),
        second_equals_third=torch.equal(steps[1], steps[2]),
        first_gap=(steps[0] - steps[1]).abs().max().item(),
        first_is_param_order=torch.equal(steps[0], in_param_order),
        later_is_ready_order=torch.equal(steps[1], in_ready_order),
        rebuilt_order=rebuilt,
    )


@record
def main() -> None:
    os.environ.setdefault(RUN_DIR_ENV, "runs/sum_order")  # where report() writes summary.json
    info = setup_distributed()
    if info.world_size < 2:
        raise SystemExit(
            "sum_order needs two ranks or more (three to see the order matter): run it under torchrun"
        )
    sum_order(info.rank, info.world_size, info.device)


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
