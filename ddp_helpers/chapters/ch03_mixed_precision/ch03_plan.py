"""Notebook 03 and its companion: fp32, bf16 and fp16 side by side (each group on one device kind), the
convergence runs, and the overflow demo (two ranks at least); every size the notebooks use comes from here.
"""

from __future__ import annotations

from typing import Any

from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, by_kind, placement, placement_line

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
# How long each experiment runs; smoke mode (CI) shortens the runs, never the sizes above.
# steps: per speed run; repeats: speed runs of each precision (their spread is the noise a speed-up
# must beat); epochs: of each convergence run on the digits; fp32_seeds: fp32 convergence runs, each
# with its own seed (fp32's own run-to-run spread, against which AMP's gap is read).
LENGTHS = {
    False: {"steps": 40, "repeats": 3, "epochs": 12, "fp32_seeds": 3},
    True: {"steps": 12, "repeats": 1, "epochs": 2, "fp32_seeds": 2},
}
WARMUP_STEPS = 5  # speed runs: the first steps (allocation, caches) are left out of the timing
LOG_EVERY = 5  # every run logs (and reads the clock) every N steps
SPEED_LR = 0.01  # small, so no speed run blows up; their loss is not the point
CONV_BATCH_SIZE = 32  # per process, in the convergence runs: an epoch of digits is many steps
CONV_LR = 0.05  # the worker's default, which trains the digits MLP
MAX_GRAD_NORM = 1.0  # every run clips the gradient norm to this (nanoGPT's value), after scaler.unscale_
OVERFLOW_STEPS = (1, 2, 4)  # fp16 speed runs: rank 1's gradients made inf here, inside the untimed warm-up
OVERFLOW_RANK = 1


def speed_args(device: str, smoke: bool) -> list[str]:
    """The worker's arguments for a speed run on `device` (the precision, `--amp`, is the caller's)."""
    sizes = {**by_kind(device, SPEED_SIZES), **LENGTHS[smoke]}
    args: list[Any] = ["--model", sizes["model"], "--image-size", sizes["image_size"]]
    args += ["--batch-size", sizes["batch_size"], "--steps", sizes["steps"], "--warmup-steps", WARMUP_STEPS]
    args += ["--log-every", LOG_EVERY, "--lr", SPEED_LR, "--max-grad-norm", MAX_GRAD_NORM]
    return [str(a) for a in args]


def overflow_args() -> list[str]:
    """The worker's arguments that make rank 1's gradients inf at OVERFLOW_STEPS (fp16 runs, 2+ ranks)."""
    return ["--overflow-at-steps", *map(str, OVERFLOW_STEPS), "--overflow-rank", str(OVERFLOW_RANK)]


def convergence_args(smoke: bool) -> list[str]:
    """The worker's arguments for a convergence run: the MLP on the real digits, scored on the test set."""
    args: list[Any] = ["--model", "mlp", "--dataset", "digits", "--batch-size", CONV_BATCH_SIZE]
    args += ["--epochs", LENGTHS[smoke]["epochs"], "--eval", "--log-every", LOG_EVERY, "--lr", CONV_LR]
    args += ["--max-grad-norm", MAX_GRAD_NORM]
    return [str(a) for a in args]


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
        sizes={**by_kind(ranks.device, SPEED_SIZES), **LENGTHS[smoke], "overflow_steps": OVERFLOW_STEPS},
    )
