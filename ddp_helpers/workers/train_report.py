"""What train.py measures and reports: step and phase timers, each rank's metrics lines, rank 0's summary.
Every figure a notebook shows about a training run comes from here."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_helpers.rank.distributed import DistInfo
from ddp_helpers.rank.metrics import MetricsWriter
from ddp_helpers.workers.train_state import Position, Run, Training


@dataclass
class StepTimer:
    """Seconds per step, leaving out the first `warmup_steps`; reads the clock only when asked to."""

    now: Callable[[], float]  # PhaseTimer's clock: on a GPU it synchronises first
    warmup_steps: int
    step_times: list[float] = field(default_factory=list)
    _start: float | None = None
    _start_step: int = 0

    def after_step(self, step: int, read: bool) -> float | None:
        """The mean step time since the last read, when `read` (and a window is open); else None."""
        if self._start is None and step >= self.warmup_steps:
            self._start, self._start_step = self.now(), step
        if not read:
            return None
        now = self.now()  # the one synchronisation per log window
        if self._start is None or step == self._start_step:
            return None
        step_time = (now - self._start) / (step - self._start_step)
        self.step_times.extend([step_time] * (step - self._start_step))
        self._start, self._start_step = now, step
        return step_time

    @property
    def median(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None


@dataclass
class PhaseTimer:
    """A logged step in two phases: data_time_s (waiting for the batch: no collective, this rank's own time)
    and train_step_time_s (forward, backward, optimizer: DDP's collectives run here, so an early rank waits
    here for the last one)."""

    device: torch.device
    timed: bool = False
    data_time_s: float | None = None
    train_step_time_s: float | None = None
    _marks: list[float] = field(default_factory=list)

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the GPU's work so far is done, not only queued
        return time.perf_counter()

    def start(self, timed: bool) -> None:
        self.timed, self._marks = timed, [self.now()] if timed else []

    def batch_ready(self) -> None:
        if self.timed:
            self._marks.append(self.now())

    def step_done(self) -> None:
        if self.timed:
            start, ready, done = *self._marks, self.now()
            self.data_time_s, self.train_step_time_s = ready - start, done - ready


class Reporter:
    """Every rank's metrics (JSON lines), rank 0's TensorBoard scalars, and the step timer."""

    def __init__(self, args: argparse.Namespace, world: DistInfo, last_step: int) -> None:
        self.last_step = last_step
        self.log_every = args.log_every
        self.batch_size, self.world_size = args.batch_size, world.world_size
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        self.phases = PhaseTimer(world.device)
        self.timer = StepTimer(self.phases.now, args.warmup_steps)
        self.writer = MetricsWriter(args.run_dir, world.rank)
        self.tensorboard = None
        if args.tensorboard and world.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(os.path.join(args.run_dir, "tensorboard"))

    def logs(self, step: int) -> bool:
        """Whether `step` is logged (and its phases timed)."""
        return step % self.log_every == 0 or step == self.last_step

    def after_step(self, pos: Position, loss: torch.Tensor, training: Training) -> None:
        log_now = self.logs(pos.step)
        step_time = self.timer.after_step(pos.step, read=log_now)
        if not log_now:
            return
        loss_value, lr = loss.item(), training.optimizer.param_groups[0]["lr"]
        scale = training.scaler.get_scale() if training.scaler.is_enabled() else None
        samples = pos.step * self.batch_size
        self.writer.log(
            step=pos.step,
            epoch=pos.epoch,
            loss=loss_value,
            samples=samples,
            global_samples=samples * self.world_size,
            step_time_s=step_time,
            lr=lr,
            grad_scale=scale,
            attempt=self.attempt,
            data_time_s=self.phases.data_time_s,  # a logged step is a timed one
            train_step_time_s=self.phases.train_step_time_s,
            **step_facts(training),
        )
        if self.tensorboard:
            self.tensorboard.add_scalar("loss", loss_value, pos.step)
            self.tensorboard.add_scalar("lr", lr, pos.step)
            if step_time:
                self.tensorboard.add_scalar(
                    "samples_per_s", self.batch_size * self.world_size / step_time, pos.step
                )

    def close(self) -> None:
        self.writer.close()
        if self.tensorboard:
            self.tensorboard.close()


def step_facts(training: Training) -> dict:
    """What this rank's last step did, measured: the checks a notebook makes on AMP and on a resume."""
    return {
        "skipped_steps": training.skipped_steps,  # this rank's own count
        "grad_norm": None if training.grad_norm is None else training.grad_norm.item(),  # what the clip saw
        "output_dtype": None if training.output_dtype is None else str(training.output_dtype),
        "local_overflows": None if training.local_overflows is None else int(training.local_overflows.item()),
        "rng_crc": rng_fingerprint(training.device),
    }


def rng_fingerprint(device: torch.device) -> int:
    """CRC-32 of this rank's torch generator states (CPU and GPU): equal ones mean the same random numbers."""
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return zlib.crc32(b"".join(state.numpy().tobytes() for state in states))


def mean_over_ranks(value: torch.Tensor, world: DistInfo) -> torch.Tensor:
    value = value.detach().float().clone()
    if world.distributed:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)  # SUM then divide: every backend has SUM
        value /= world.world_size
    return value


def peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    # ru_maxrss is in KiB on Linux: the whole process's peak resident set, not just tensors
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu_peak_rss"


def device_memory(args: argparse.Namespace, world: DistInfo) -> dict:
    """How many devices this process drove, and each one's peak (DataParallel: every GPU, GPU 0 the most)."""
    if args.mode == "dp" and world.device.type == "cuda" and torch.cuda.device_count() > 1:
        gpus = range(torch.cuda.device_count())
        return {
            "devices": len(gpus),
            "peak_mem_bytes_per_device": [torch.cuda.max_memory_allocated(i) for i in gpus],
        }
    return {"devices": 1 if args.mode != "ddp" else world.world_size, "peak_mem_bytes_per_device": None}


def precision_flags(device: torch.device) -> dict:
    """What "fp32" meant in this run: on Ampere and newer, TF32 for convolutions (default) and maybe matmuls."""
    flags = {
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "device_capability": None,  # (8, 0) and up: Ampere or newer, where TF32 exists
        "bf16_native": None,  # GPUs only
    }
    if device.type == "cuda":
        flags["device_capability"] = list(torch.cuda.get_device_capability(device))
        # bf16 in hardware (compute capability 8.0 and up); older GPUs (V100, T4) emulate it, slowly
        flags["bf16_native"] = torch.cuda.is_bf16_supported(including_emulation=False)
    return flags


def summarize(run: Run, reporter: Reporter) -> dict:
    """The summary.json fields that need no collective (the caller adds loss and accuracy)."""
    args, world, data, training, pos = run.args, run.world, run.data, run.training, run.pos
    global_batch = args.batch_size * world.world_size
    median_step = reporter.timer.median
    peak_bytes, peak_kind = peak_memory(world.device)
    return {
        "mode": args.mode,
        "world_size": world.world_size,
        "backend": world.backend,
        "device": str(world.device),
        "amp": args.amp,
        "model": args.model,
        "dataset": data.name,
        "batch_size": args.batch_size,
        "global_batch_size": global_batch,
        "steps": pos.step,
        "epochs": round(pos.step / len(data.loader), 3),
        "lr": args.lr,
        "seed": args.seed,
        "deterministic": args.deterministic,
        "attempt": reporter.attempt,
        "samples_per_s": global_batch / median_step if median_step else None,
        "step_time_median_s": median_step,
        "timed_steps": len(reporter.timer.step_times),
        "peak_mem_bytes": peak_bytes,
        "peak_mem_kind": peak_kind,
        "grad_scale": training.scaler.get_scale() if training.scaler.is_enabled() else None,
        "skipped_steps": training.skipped_steps,
        "output_dtype": None if training.output_dtype is None else str(training.output_dtype),
        "param_dtype": str(next(training.raw_model.parameters()).dtype),  # autocast leaves the weights fp32
        "num_threads": torch.get_num_threads(),
        **precision_flags(world.device),
        "torch_version": torch.__version__,
        **device_memory(args, world),
    }


def inject_overflow(model: nn.Module, steps: set[int]) -> torch.Tensor:
    """Fault injection: inf/NaN gradients for this rank's first weight at these steps, before DDP averages;
    returns the count of steps at which this rank's own gradient was not finite (before the all-reduce)."""
    backward_calls = 0
    first = next(model.parameters())
    local_overflows = torch.zeros((), dtype=torch.int64, device=first.device)

    def overflow(grad: torch.Tensor) -> torch.Tensor:
        nonlocal backward_calls
        backward_calls += 1
        grad = grad * float("inf") if backward_calls in steps else grad  # 0 * inf is NaN: both kinds
        local_overflows.add_((~torch.isfinite(grad)).any().long())  # no sync: read when logged
        return grad

    first.register_hook(overflow)  # a tensor hook: it sees this rank's gradient, before DDP averages it
    return local_overflows
