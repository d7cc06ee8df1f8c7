"""A plain, well-written torchrun DDP script, in the manner of pytorch/examples' ddp-tutorial-series
(multigpu_torchrun.py), used as the yardstick for ddp_helpers/workers/train.py in `make bench`.

Same workload as the worker: ResNet-18, synthetic 3x32x32 images, SGD, batch per rank from the
command line. It times the median step after warm-up, synchronised, and prints one JSON line.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, model, loader, optimizer, device):
        self.device = device
        self.model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
        self.loader = loader
        self.optimizer = optimizer

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def train(self, steps, warmup):
        times, step = [], 0
        while step < steps:
            self.loader.sampler.set_epoch(step)
            for source, targets in self.loader:
                start = time.perf_counter()
                self._run_batch(source.to(self.device), targets.to(self.device))
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                if step >= warmup:
                    times.append(time.perf_counter() - start)
                step += 1
                if step >= steps:
                    break
        return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    init_process_group(backend=backend)
    local_rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 3, 32, 32), torch.randint(0, 10, (1024,)))
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data), drop_last=True)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    trainer = Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), device)
    step_time = trainer.train(args.steps, args.warmup)
    if int(os.environ["RANK"]) == 0:
        print(json.dumps({"samples_per_s": args.batch_size * world / step_time, "step_time_s": step_time}))
    destroy_process_group()


if __name__ == "__main__":
    main()
