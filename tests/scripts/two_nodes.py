# One process per "node": the all_reduce crosses both torchrun agents.
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(
    f"rank {rank} of {dist.get_world_size()} on node {os.environ['GROUP_RANK']}: sum {total.item():g}",
    flush=True,
)
dist.destroy_process_group()
