# Uneven inputs: rank 1 has 5 batches and leaves (exit code 0); rank 0 has 8 and waits for a peer that is gone.
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
steps = 5 if rank == 1 else 8
for step in range(steps):
    grad = torch.ones(1)
    dist.all_reduce(grad)
    print(f"step {step}", flush=True)
print(f"rank {rank} done after {steps} steps", flush=True)
os._exit(0)  # leave at once, as a finished script would, without waiting for the other rank
