"""Notebook 03: the same DDP job in fp32, bf16 and fp16, its convergence runs, and the overflow demo.

The speed runs and the convergence runs each put precisions side by side, so each group runs on one
device kind: NCCL where every rank has a GPU of its own, else gloo on the CPU. The overflow demo needs
a second rank (one rank has nobody to disagree with), so with nproc = 1 it runs two, and says where.
The speed runs' sizes go by device kind: on GPUs, work where tensor cores and compute dominate a step.
"""

from __future__ import annotations

from typing import Any

from .core import Machine, NotebookPlan, by_kind, placement, placement_line

# The CPU's sizes are today's CI sizes: the MLP (16-bit convolutions on a CPU without bf16/fp16
# instructions run many times slower than fp32). A GPU gets ResNet-50 at 224 px, where tensor cores
# show: about 82 MiB of activations saved per image in fp32, 42 MiB under bf16 autocast (autograd's
# saved_tensors_hooks, torch 2.14.1), so 128 images per GPU hold ~11 GiB in fp32: comfortable in 80 GB.
# memory_batch: the images of the kernel's own count of saved bytes (a CPU forward in this kernel),
# the speed batch on the CPU, a few images on GPUs, where a 128-image CPU forward would save ~11 GiB.
SPEED_SIZES = {
    "cpu": {"model": "mlp", "image_size": 32, "batch_size": 64, "memory_batch": 64},
    "cuda": {"model": "resnet50", "image_size": 224, "batch_size": 128, "memory_batch": 4},
}


def speed_sizes(device: str) -> dict[str, Any]:
    """The speed runs' sizes on `device` ("cpu" or "cuda"); smoke mode shortens steps, not sizes."""
    return by_kind(device, SPEED_SIZES)


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    ranks = placement(machine)
    demo = placement(machine, max(machine.nproc, 2))  # the overflow demo and the exercise: two ranks or more
    line = placement_line(machine, ranks)
    if machine.nproc < 2:
        line += f" The overflow demo and the exercise need two ranks: {placement_line(machine, demo)}"
    return NotebookPlan(
        notebook="03",
        machine=machine,
        device=ranks.device,
        line=line,
        runs={"speed": ranks, "converge": ranks, "overflow": demo, "exercise": demo},
        compared=(("speed",), ("converge",)),
        sizes=speed_sizes(ranks.device),
    )
