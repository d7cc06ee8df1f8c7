"""Notebook 02: one process, DataParallel and DDP, and the scaling sweep, all on one device kind; then
the demos on live ranks (DDP is a bigger batch, a straggler, the learning-rate rule, mp.spawn) and the
exercise, which need a second rank: at least two, on gloo with the GPUs hidden where GPUs are too few."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ddp_helpers.kernel.lab.plan_core import (
    Machine,
    NotebookPlan,
    RunPlan,
    by_kind,
    placement,
    placement_line,
)

# ------------------------------------------------------------------ the throughput runs
# Every run on one device kind: NCCL only where every DDP rank has a GPU, else all on the CPU with the GPUs
# hidden (DataParallel would reach for them). A GPU needs steps long enough for DDP's all-reduce to hide
# behind backward (ResNet-18 at 32 px is a few ms on an H100): ResNet-50 at 224 px saves ~82 MiB of fp32
# activations per image (torch 2.14.1), so 128 images hold ~11 GiB; 2048 images are 1.2 GB of host memory.
THROUGHPUT_SIZES = {
    "cpu": {"model": "resnet18", "image_size": 32, "num_samples": 2048, "batch_size": 32},
    "cuda": {"model": "resnet50", "image_size": 224, "num_samples": 2048, "batch_size": 128},
}
# smoke mode (CI, on the CPU): the MLP; a GPU keeps its sizes, which it runs in seconds
SMOKE_SIZES = {"cpu": {**THROUGHPUT_SIZES["cpu"], "model": "mlp"}, "cuda": THROUGHPUT_SIZES["cuda"]}


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    gpus, nproc = machine.gpus, machine.nproc
    if gpus >= nproc:  # one GPU per rank: NCCL, and DataParallel over the same GPUs
        device, backend, env, dp_devices = "cuda", "auto", {}, nproc
        dp_env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(nproc)))} if gpus > nproc else {}
        line = f"every run on GPUs: DDP with nccl, one GPU per rank ({gpus} visible)."
    else:  # no GPU at all, or fewer GPUs than ranks (then hidden, and gloo named explicitly)
        device, backend, dp_devices = "cpu", "gloo" if gpus else "auto", 1
        env = dp_env = {"OMP_NUM_THREADS": "1", **({"CUDA_VISIBLE_DEVICES": ""} if gpus else {})}
        line = (
            f"{nproc} ranks but {gpus} GPU(s): NCCL needs one GPU per rank, so every run (single and "
            "DataParallel too, with the GPUs hidden) goes to the CPU, one core per process, to compare like "
            "with like."
            if gpus
            else "every run on the CPU with gloo (no GPU here), one core per process."
        )

    def run(n: int) -> RunPlan:
        return RunPlan(n, backend, device, n, dict(env))

    dp = RunPlan(1, backend, device, dp_devices, dict(dp_env))
    runs: dict[str, RunPlan] = {"single": run(1), "dataparallel": dp, "ddp": run(nproc)}
    sweep = sorted({n for n in (1, 2, 4, 8, 16, 32) if n <= nproc} | {nproc})  # 1, 2, 4, ... and nproc
    runs |= {f"sweep-{n}": run(n) for n in sweep}
    compared: tuple[tuple[str, ...], ...] = (tuple(runs),)
    world = max(nproc, 2)  # a straggler, an average over ranks: a second rank at least
    demo = placement(machine, world)
    runs |= {"demo": demo, "exercise": demo}
    compared += (("demo",),)  # section 5: DDP against one process at the global batch, on rank 0
    if world != nproc or demo.device != device:
        line += f" The demos on live ranks need two at least: {placement_line(machine, demo)}"
    return NotebookPlan(
        notebook="02",
        machine=machine,
        device=device,
        line=line,
        runs=runs,
        compared=compared,
        sizes=by_kind(device, SMOKE_SIZES if smoke else THROUGHPUT_SIZES),
    )


# ------------------------------------------------------------------ sizes and lengths the notebooks read
# The lesson (notebooks/02_single_vs_dataparallel_vs_ddp.ipynb) and its companion
# (notebooks/deeper/02_measurements_and_launchers.ipynb) take every size and length from here.
# Throughput runs: every run times the same steps after the same warm-up, whatever its world size (one
# epoch at 8 ranks would hold only num_samples / (8 x batch_size) steps), and reads the clock (a GPU sync)
# every LOG_EVERY steps, not every step. Smoke mode (CI) shortens the runs, never the sizes.
WARMUP_STEPS = 2  # left out of every timing: DDP builds its buckets, the allocator warms up
TIMED_STEPS = {False: 40, True: 10}  # by smoke
REPEATS = {False: 3, True: 1}  # timed runs of each mode (the companion's noise measurement), by smoke
LOG_EVERY = 10
THROUGHPUT_LR = 0.01  # the speed does not depend on it; small, so no run blows up
# DDP against one process at the global batch: the MLP (no BatchNorm, which normalises per rank's batch)
EQ_BATCH = 32  # per rank, on every device kind
ROUNDING_TOLERANCE = 1e-4  # sums in another order differ by ~1e-7 per step, far below this
STRAGGLER_RANK, STRAGGLER_MS = 1, 40  # the companion slows this rank's data by this much: far above jitter
# The learning-rate runs: the MLP with SGD and momentum on the real digits, where every run learns
LR_BASE = 0.01  # the single process's lr
LR_BATCH = 32  # per process
LR_EPOCHS = 2


def throughput_args(sizes: Mapping[str, Any], smoke: bool) -> list[str]:
    """The worker's arguments shared by every throughput run (the mode and the batch are the caller's)."""
    args: list[Any] = ["--model", sizes["model"], "--image-size", sizes["image_size"]]
    args += ["--num-samples", sizes["num_samples"], "--lr", THROUGHPUT_LR]
    args += ["--steps", WARMUP_STEPS + TIMED_STEPS[smoke]]
    args += ["--log-every", LOG_EVERY, "--warmup-steps", WARMUP_STEPS]  # each log reads the clocks
    return [str(a) for a in args]


def equality_args() -> list[str]:
    """The MLP for 10 deterministic steps, logging every step: DDP against one process at the global batch."""
    args: list[Any] = ["--model", "mlp", "--num-samples", 512, "--steps", 10, "--deterministic"]
    return [str(a) for a in (*args, "--log-every", 1)]


def lr_args(smoke: bool) -> list[str]:
    """The learning-rate runs' shared arguments: the digits MLP at LR_BATCH per process (lr and mode: the caller's)."""
    args: list[Any] = ["--model", "mlp", "--dataset", "digits", "--epochs", LR_EPOCHS, "--log-every", 1]
    return [str(a) for a in (*args, "--batch-size", LR_BATCH)]


def train_on_ranks(ranks: Any, *args: Any, run_dir: str | Path, single: bool = False) -> SimpleNamespace:
    """train.py's main(argv) on live ranks that imported it as `train`, into a fresh run_dir."""
    from ddp_helpers import read_metrics, read_summary

    run_dir = Path(run_dir).resolve()
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics files are appended to: start clean
    argv = [str(a) for a in (*args, "--run-dir", run_dir)]
    one_process = {"WORLD_SIZE": "1"} if single else None  # for this call only
    ranks.call("train.main", argv, ranks=0 if single else None, environ=one_process)
    return SimpleNamespace(run_dir=run_dir, metrics=read_metrics(run_dir), summary=read_summary(run_dir))
