# The trivial 2-rank job both sides of the benchmark run: init, one all_reduce, tear down.
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(1)
dist.all_reduce(x)
assert x.item() == dist.get_world_size()
print(f"rank {dist.get_rank()} ok")
dist.destroy_process_group()
