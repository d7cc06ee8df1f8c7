# Rank 1 never reaches the collective that rank 0 waits in: a hang.
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    print("rank 0 entering all_reduce", flush=True)
    dist.all_reduce(torch.ones(1))
else:
    print("rank 1 skips the all_reduce", flush=True)
    while True:
        time.sleep(1)
