"""Train an image classifier on one device, with DataParallel, or with DDP.

    python train.py --mode single --steps 50
    python train.py --mode dp --steps 50                 # one process, all visible GPUs
    torchrun --nproc-per-node 2 train.py --steps 50      # DDP, one process per GPU (or 2 on the CPU)

Each rank appends one JSON line per logged step to <run-dir>/metrics/rank{R}.jsonl, and
rank 0 writes <run-dir>/summary.json at the end. The notebooks read those files.

Read it from `main()` down: setup, data, model, resume, wrap, the loop (`train`, `train_step`),
then the results. ddp.py is the same idea in 70 lines, without the measuring and checkpointing.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Subset

from ddp_helpers import teardown
from ddp_helpers.checkpoint import capture_rng, load_latest_on_every_rank, restore_rng, save_checkpoint
from ddp_helpers.data import DATASETS, ResumableDistributedSampler, build_dataset
from ddp_helpers.distributed import DistInfo, setup_distributed
from ddp_helpers.metrics import MetricsWriter

# what --resume-ignore can leave out of a resume: each name drops that state and nothing else
RESUME_PARTS = ("rng", "optimizer", "scheduler", "scaler")


# -----------------------------------------------------------------------------
# config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    under_torchrun = int(os.environ.get("RANK", -1)) != -1
    p.add_argument("--mode", choices=["single", "dp", "ddp"], default="ddp" if under_torchrun else "single")
    p.add_argument("--model", choices=["mlp", "resnet18", "resnet50"], default="mlp")
    p.add_argument("--hidden", type=int, default=256, help="width of the MLP's hidden layers")
    p.add_argument("--dataset", choices=DATASETS, default="synthetic")
    p.add_argument("--num-samples", type=int, default=2048, help="synthetic dataset size")
    p.add_argument("--image-size", type=int, default=32, help="synthetic image side, in pixels")
    p.add_argument(
        "--batch-size", type=int, default=32, help="per rank: the global batch is this x world size"
    )
    p.add_argument("--steps", type=int, default=None, help="optimizer steps to run (default: --epochs)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    p.add_argument("--dropout", type=float, default=0.0, help="MLP dropout: makes the RNG state matter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--deterministic", action="store_true", help="deterministic kernels: bitwise-repeatable runs"
    )
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--log-every", type=int, default=10, help="log (and synchronise for timing) every N steps")
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the throughput figure")
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off")
    p.add_argument("--max-grad-norm", type=float, default=None, help="clip the gradient norm (default: off)")
    p.add_argument(
        "--overflow-at-steps", type=int, nargs="*", default=[], help="fault injection: inf grads..."
    )
    p.add_argument("--overflow-rank", type=int, default=0, help="...on this rank, at these steps of its own")
    p.add_argument(
        "--eval", action="store_true", help="report accuracy on the dataset's test split at the end"
    )
    p.add_argument("--save-final", default=None, help="write the plain (non-DDP) model state_dict here")
    p.add_argument("--checkpoint-dir", default=None, help="save checkpoints here (rank 0 writes, atomically)")
    p.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-checkpoints", type=int, default=3, help="how many recent checkpoints to keep")
    p.add_argument("--resume", action="store_true", help="continue from the latest good checkpoint, if any")
    p.add_argument(
        "--resume-ignore",
        nargs="*",
        choices=RESUME_PARTS,
        default=[],
        help="teaching aid: resume without these states (each drops only its own), to watch the run drift",
    )
    p.add_argument("--stop-at-step", type=int, default=None, help="stop after this step, as if interrupted")
    p.add_argument("--fail-at-step", type=int, default=None, help="fault injection: raise at this step...")
    p.add_argument("--fail-rank", type=int, default=0, help="...on this rank (first attempt only)")
    p.add_argument(
        "--tensorboard", action="store_true", help="also write TensorBoard scalars to <run-dir>/tensorboard"
    )
    p.add_argument(
        "--straggler",
        type=straggler_spec,
        default=None,
        metavar="RANK:MS",
        help="fault injection: RANK waits MS milliseconds more for each batch, as a slow data loader would",
    )
    p.add_argument("--run-dir", default=os.environ.get("DDP_RUN_DIR", "runs/train"))
    args = p.parse_args(argv)
    if args.tensorboard and not tensorboard_installed():
        p.error("--tensorboard needs the tensorboard package: pip install tensorboard")
    if args.mode in ("single", "dp") and int(os.environ.get("WORLD_SIZE", 1)) > 1:
        p.error(f"--mode {args.mode} is one process; start it with python, not torchrun --nproc-per-node > 1")
    if args.mode == "ddp" and not under_torchrun:
        p.error(
            "--mode ddp needs torchrun, which sets RANK and WORLD_SIZE: torchrun --nproc-per-node 2 train.py"
        )
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if args.straggler and args.straggler[0] >= world_size:
        p.error(
            f"--straggler {args.straggler[0]}:...: there is no rank {args.straggler[0]} among {world_size}"
        )
    if args.resume and not args.checkpoint_dir:
        p.error("--resume needs --checkpoint-dir")
    counts = ("batch_size", "epochs", "steps", "stop_at_step", "log_every", "save_every", "keep_checkpoints")
    for name in counts:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def straggler_spec(text: str) -> tuple[int, float]:
    """--straggler RANK:MS, e.g. 1:40, as (rank, milliseconds); anything else is refused by argparse."""
    rank, sep, ms = text.partition(":")
    try:
        spec = int(rank), float(ms)
    except ValueError:
        spec = None
    if not sep or spec is None or spec[0] < 0 or not 0 < spec[1] < 60_000:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected RANK:MS, a rank >= 0 and 0 < MS < 60000, e.g. 1:40"
        )
    return spec


def tensorboard_installed() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


# -----------------------------------------------------------------------------
# the pieces of a run


@dataclass
class Position:
    """Where the run is: with the states below, all a checkpoint needs to continue exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0


@dataclass
class Data:
    name: str
    dataset: Dataset
    shape: tuple[int, int, int]
    num_classes: int
    channels: int
    sampler: ResumableDistributedSampler
    loader: DataLoader


@dataclass
class Training:
    """The model and everything that updates it."""

    model: nn.Module  # what the loop calls: DDP- or DataParallel-wrapped once wrap() ran
    raw_model: nn.Module  # the plain model: what is saved, evaluated and resumed
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype | None  # autocast's dtype, None for full precision
    memory_format: torch.memory_format
    device: torch.device
    max_grad_norm: float | None = None  # clip the gradients' global norm to this; None: no clipping
    skipped_steps: int = 0  # steps whose optimizer step the GradScaler skipped (inf/NaN gradients)


def setup(args: argparse.Namespace) -> DistInfo:
    """Join the process group under DDP; describe the one process otherwise."""
    if args.mode == "ddp":
        # nccl for GPUs, gloo for CPUs (the launcher says which through DDP_BACKEND); the
        # device comes from LOCAL_RANK, and init_process_group gets it as device_id on GPUs
        return setup_distributed()
    use_cuda = torch.cuda.is_available() and os.environ.get("DDP_DEVICE", "cuda") != "cpu"
    return DistInfo(0, 0, 1, 1, "none", torch.device("cuda" if use_cuda else "cpu"))


def build_data(args: argparse.Namespace, world: DistInfo) -> Data:
    """Every mode goes through a DistributedSampler (num_replicas=1 without DDP), so N ranks at
    batch B see exactly the samples one process sees at batch N*B."""
    channels = 3 if args.model.startswith("resnet") else 1 if args.dataset == "digits" else 3
    info = build_dataset(
        args.dataset,
        num_samples=args.num_samples,
        image_size=args.image_size,
        channels=channels,
        seed=args.seed,
    )
    sampler = ResumableDistributedSampler(
        info.dataset,
        num_replicas=world.world_size,
        rank=world.rank,
        shuffle=True,
        seed=args.seed,
        drop_last=True,
    )
    loader = DataLoader(
        info.dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        pin_memory=world.device.type == "cuda",  # page-locked host memory makes non_blocking copies real
        generator=torch.Generator().manual_seed(args.seed + world.rank),  # loader workers' seeds: per rank
    )
    if len(loader) == 0:
        raise SystemExit(
            f"{len(info.dataset)} samples are too few for batch {args.batch_size} x {world.world_size} ranks"
        )
    return Data(info.name, info.dataset, info.shape, info.num_classes, channels, sampler, loader)


def build_model(
    name: str, shape: tuple[int, int, int], num_classes: int, hidden: int, dropout: float = 0.0
) -> nn.Module:
    if name == "mlp":
        c, h, w = shape
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * h * w, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
    import torchvision  # here, not at the top: it takes seconds to import and the MLP needs none of it

    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)  # no download: offline
    if shape[0] != 3:
        model.conv1 = nn.Conv2d(shape[0], 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def build_training(args: argparse.Namespace, world: DistInfo, data: Data, total_steps: int) -> Training:
    """Model, optimizer, schedule and loss scaler, not wrapped yet."""
    device = world.device
    # the same seed on every rank: identical initial weights (DDP broadcasts rank 0's anyway)
    torch.manual_seed(args.seed)
    model = build_model(args.model, data.shape, data.num_classes, args.hidden, args.dropout)
    channels_last = device.type == "cuda" and args.model != "mlp"  # faster convolutions on GPUs
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    # from here on each rank draws its own dropout masks: seed + rank
    torch.manual_seed(args.seed + world.rank)

    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.lr_schedule == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    else:
        scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    # fp16 has a narrow range: scale the loss so small gradients do not flush to zero. On the CPU
    # too: CPU autocast takes float16 and GradScaler("cpu") exists (torch 2.7 and later)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    if world.rank == args.overflow_rank and args.overflow_at_steps:
        inject_overflow(model, set(args.overflow_at_steps))
    return Training(
        model, model, optimizer, scheduler, scaler, amp_dtype, memory_format, device, args.max_grad_norm
    )


def inject_overflow(model: nn.Module, steps: set[int]) -> None:
    """Fault injection: at these steps (counted from 1 in this process) this rank's first weight
    gets inf/NaN gradients, as an fp16 overflow gives them, before DDP all-reduces them."""
    backward_calls = 0

    def overflow(grad: torch.Tensor) -> torch.Tensor:
        nonlocal backward_calls
        backward_calls += 1
        return grad * float("inf") if backward_calls in steps else grad  # 0 * inf is NaN: both kinds

    next(model.parameters()).register_hook(overflow)


def wrap(args: argparse.Namespace, world: DistInfo, training: Training) -> None:
    """DDP: one process per device, gradients averaged during backward. DP: one process, all GPUs."""
    if args.mode == "ddp":
        on_gpu = world.device.type == "cuda"
        # gradient_as_bucket_view: grads live inside DDP's all-reduce buckets, saving a copy
        training.model = DDP(
            training.raw_model,
            device_ids=[world.local_rank] if on_gpu else None,
            gradient_as_bucket_view=True,
        )
    elif args.mode == "dp":
        gpus = torch.cuda.device_count()
        if gpus < 2:
            print(f"DataParallel sees {gpus} GPU(s): it runs the module on one device, unsplit")
        training.model = nn.DataParallel(training.raw_model)


# -----------------------------------------------------------------------------
# the loop


def train_step(training: Training, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One optimizer step on one batch; returns the loss (on the device, not synchronised)."""
    device, amp_dtype = training.device, training.amp_dtype
    x = x.to(device, non_blocking=True, memory_format=training.memory_format)
    y = y.to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(training.model(x), y)
    training.optimizer.zero_grad(set_to_none=True)
    # fp16: the loss times the scale, so small gradients stay above fp16's smallest number; DDP
    # all-reduces the gradient buckets during backward, in the parameters' dtype (fp32)
    training.scaler.scale(loss).backward()
    if training.max_grad_norm is not None:
        # clip the true gradients: divide the scale out first (in place; step() won't again)
        training.scaler.unscale_(training.optimizer)
        torch.nn.utils.clip_grad_norm_(training.model.parameters(), training.max_grad_norm)
    scale = training.scaler.get_scale()  # 1.0 without a scaler; else a sync, as step() makes one
    training.scaler.step(training.optimizer)  # no optimizer.step() if any gradient is inf/NaN...
    training.scaler.update()  # ...and then the scale shrinks: that marks every skipped step
    training.skipped_steps += int(training.scaler.get_scale() < scale)
    training.scheduler.step()
    return loss


def train(
    args: argparse.Namespace,
    world: DistInfo,
    data: Data,
    training: Training,
    pos: Position,
    reporter: Reporter,
) -> torch.Tensor:
    """Run steps until `reporter.last_step`, logging and checkpointing on the way; the last loss."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    loss = torch.zeros((), device=world.device)
    training.model.train()
    while pos.step < reporter.last_step:
        data.sampler.set_epoch(pos.epoch)  # a new shuffle each epoch, the same one on every rank
        # after a mid-epoch resume, the epoch starts at the very next batch
        data.sampler.start_at(pos.batch_in_epoch * args.batch_size)
        reporter.phases.start(timed=reporter.logs(pos.step + 1))  # the clock runs while the loader works
        for x, y in data.loader:
            if args.straggler and args.straggler[0] == world.rank:
                time.sleep(args.straggler[1] / 1000)  # injected: this rank's data loading is MS slower
            reporter.phases.batch_ready()
            loss = train_step(training, x, y)
            reporter.phases.step_done()
            pos.step += 1
            pos.batch_in_epoch += 1
            if args.fail_at_step == pos.step and world.rank == args.fail_rank and attempt == 0:
                raise RuntimeError(f"injected fault on rank {world.rank} at step {pos.step}")
            reporter.after_step(pos, loss, training)
            if args.checkpoint_dir and (pos.step % args.save_every == 0 or pos.step == reporter.last_step):
                save(args, world, training, pos)
            if pos.step >= reporter.last_step:
                break
            reporter.phases.start(timed=reporter.logs(pos.step + 1))
        else:
            pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0  # the epoch ran to its end
    return loss


@dataclass
class StepTimer:
    """Seconds per step, leaving out the first `warmup_steps`; reads the clock only when asked to."""

    device: torch.device
    warmup_steps: int
    step_times: list[float] = field(default_factory=list)
    _start: float | None = None
    _start_step: int = 0

    def _now(self) -> float:
        # CUDA kernels run asynchronously: without this a timer measures the launch, not the work
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def after_step(self, step: int, read: bool) -> float | None:
        """The mean step time since the last read, when `read` (and a window is open); else None."""
        if self._start is None and step >= self.warmup_steps:
            self._start, self._start_step = self._now(), step
        if not read:
            return None
        now = self._now()  # the one synchronisation per log window
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
    """One step in two phases, on the steps that are logged (each read synchronises the device):

    data_time_s: waiting for the batch. No collective runs here, so it is this rank's own time.
    train_step_time_s: forward, backward, optimizer. DDP's collectives run here (the gradient
        all-reduce in backward; the buffer broadcast in forward, for models with buffers), so a
        rank that is early waits here for the last one: this phase holds the waiting.
    """

    device: torch.device
    timed: bool = False
    data_time_s: float | None = None
    train_step_time_s: float | None = None
    _marks: list[float] = field(default_factory=list)

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the GPU's work so far is done, not only queued
        return time.perf_counter()

    def start(self, timed: bool) -> None:
        self.timed, self._marks = timed, [self._now()] if timed else []

    def batch_ready(self) -> None:
        if self.timed:
            self._marks.append(self._now())

    def step_done(self) -> None:
        if self.timed:
            start, ready, done = *self._marks, self._now()
            self.data_time_s, self.train_step_time_s = ready - start, done - ready

    def fields(self) -> dict[str, float | None]:
        """The last timed step's phases, for the metrics line (None when the step was not timed)."""
        if not self.timed:
            return {"data_time_s": None, "train_step_time_s": None}
        return {"data_time_s": self.data_time_s, "train_step_time_s": self.train_step_time_s}


class Reporter:
    """Every rank's metrics (JSON lines), rank 0's TensorBoard scalars, and the step timer."""

    def __init__(self, args: argparse.Namespace, world: DistInfo, last_step: int) -> None:
        self.last_step = last_step
        self.log_every = args.log_every
        self.batch_size, self.world_size = args.batch_size, world.world_size
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        self.timer = StepTimer(world.device, args.warmup_steps)
        self.phases = PhaseTimer(world.device)
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
            **self.phases.fields(),
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


# -----------------------------------------------------------------------------
# results


def evaluate(training: Training, dataset: Dataset, world: DistInfo, batch_size: int) -> tuple[float, int]:
    """Accuracy over the whole test split, exact under DDP, and the number of samples scored.

    Each rank scores rank::world_size, with no padding, and the counts are summed. (A
    DistributedSampler would pad with repeated samples when the size does not divide.)
    """
    shard = Subset(dataset, range(world.rank, len(dataset), world.world_size))
    model, device, amp_dtype = training.raw_model, training.device, training.amp_dtype
    counts = torch.zeros(2, device=device)  # correct, seen
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        for x, y in DataLoader(shard, batch_size=batch_size):
            x, y = x.to(device), y.to(device)
            counts[0] += (model(x).argmax(dim=1) == y).sum()
            counts[1] += len(y)
    if world.distributed:
        dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item(), int(counts[1].item())


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
    """How many devices this process drove, and each one's peak: DataParallel drives every GPU
    from one process, and GPU 0 holds the most (the gathered outputs, the loss, the gradients)."""
    if args.mode == "dp" and world.device.type == "cuda" and torch.cuda.device_count() > 1:
        gpus = range(torch.cuda.device_count())
        return {
            "devices": len(gpus),
            "peak_mem_bytes_per_device": [torch.cuda.max_memory_allocated(i) for i in gpus],
        }
    return {"devices": 1 if args.mode != "ddp" else world.world_size, "peak_mem_bytes_per_device": None}


def precision_flags(device: torch.device) -> dict:
    """What "fp32" meant in this run: on Ampere and newer GPUs cuDNN convolutions use TF32 unless
    cudnn.allow_tf32 is False (its default is True); matmuls do only if matmul.allow_tf32 is True."""
    flags = {
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "device_capability": None,  # (8, 0) and up: Ampere or newer, where TF32 exists
    }
    if device.type == "cuda":
        flags["device_capability"] = list(torch.cuda.get_device_capability(device))
    return flags


def summarize(
    args: argparse.Namespace,
    world: DistInfo,
    data: Data,
    training: Training,
    pos: Position,
    reporter: Reporter,
) -> dict:
    """The summary.json fields that need no collective (the caller adds loss and accuracy)."""
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
        "samples_per_s_per_rank": args.batch_size / median_step if median_step else None,
        "step_time_median_s": median_step,
        "timed_steps": len(reporter.timer.step_times),
        "peak_mem_bytes": peak_bytes,
        "peak_mem_kind": peak_kind,
        "grad_scale": training.scaler.get_scale() if training.scaler.is_enabled() else None,
        "skipped_steps": training.skipped_steps,
        "num_threads": torch.get_num_threads(),
        **precision_flags(world.device),
        "torch_version": torch.__version__,
        **device_memory(args, world),
    }


# -----------------------------------------------------------------------------
# main


@record  # on failure torchelastic writes this rank's traceback to its error file
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t_start = time.time()
    world = setup(args)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = world.device.type == "cuda" and not args.deterministic

    data = build_data(args, world)
    total_steps = args.steps or args.epochs * len(data.loader)
    training = build_training(args, world, data, total_steps)
    # resume before wrapping: DDP then broadcasts the restored weights from rank 0
    pos = resume(args, world, training, len(data.loader)) if args.resume else Position()
    wrap(args, world, training)

    reporter = Reporter(args, world, last_step=min(total_steps, args.stop_at_step or total_steps))
    reporter.writer.write_plan(total_steps, mode=args.mode, world_size=world.world_size)
    if world.is_main:  # prints, plans and summaries come from rank 0 only
        resuming = f" (resuming at step {pos.step})" if pos.step else ""
        print(
            f"{args.mode}: world_size={world.world_size} backend={world.backend} device={world.device} "
            f"model={args.model} dataset={data.name} batch={args.batch_size}/rank steps={total_steps}{resuming}"
        )
    if world.distributed:  # every rank trains on a shard of its own, and says which
        print(
            f"rank {world.rank} of {world.world_size} on {world.device}: {len(data.sampler)} of "
            f"{len(data.dataset)} samples per epoch, {len(data.loader)} steps"
        )

    loss = train(args, world, data, training, pos, reporter)

    final_loss = mean_over_ranks(loss, world).item()
    accuracy, eval_samples = None, 0
    if args.eval:
        test = build_dataset(
            args.dataset,
            num_samples=max(256, args.num_samples // 4),
            image_size=args.image_size,
            channels=data.channels,
            seed=args.seed,
            split="test",
        )
        accuracy, eval_samples = evaluate(training, test.dataset, world, args.batch_size)
    if world.is_main:
        if args.save_final:  # the plain model's weights: no "module." prefix, loads into a plain model
            torch.save(training.raw_model.state_dict(), args.save_final)
        summary = summarize(args, world, data, training, pos, reporter)
        summary.update(
            final_loss=final_loss,
            eval_accuracy=accuracy,
            eval_samples=eval_samples,
            wall_s=time.time() - t_start,
        )
        reporter.writer.write_summary(summary)
        scored = f", test accuracy {accuracy:.1%} on {eval_samples} samples" if args.eval else ""
        print(f"done: {pos.step} steps, final loss {final_loss:.4f}{scored}")
    reporter.close()
    if world.distributed:
        dist.barrier()  # nobody tears the group down while rank 0 still writes


# -----------------------------------------------------------------------------
# checkpoints: everything needed to continue as if nothing had happened


def save(args: argparse.Namespace, world: DistInfo, training: Training, pos: Position) -> None:
    """Rank 0 writes one checkpoint holding every rank's RNG states; every rank must call it."""
    rng_per_rank = [capture_rng()]
    if world.distributed:
        # every rank has its own generator states: collect them all (every rank must take part)
        gathered: list = [None] * world.world_size
        dist.all_gather_object(gathered, rng_per_rank[0])
        rng_per_rank = gathered
    if world.is_main:  # one writer: N ranks writing one file would corrupt it
        state = {
            "model": training.raw_model.state_dict(),  # the plain module's: no "module." prefix
            "optimizer": training.optimizer.state_dict(),
            "scheduler": training.scheduler.state_dict(),
            "scaler": training.scaler.state_dict(),
            "step": pos.step,
            "epoch": pos.epoch,
            "batch_in_epoch": pos.batch_in_epoch,
            "world_size": world.world_size,
            "batch_size": args.batch_size,
            "rng": rng_per_rank,
            "config": vars(args),
        }
        path = save_checkpoint(state, args.checkpoint_dir, pos.step, keep=args.keep_checkpoints)
        print(f"checkpoint saved: {path.name}")
    if world.distributed:
        # no rank races ahead (or reads) before the file is complete. The others wait here at most
        # the process group's timeout (init_process_group(timeout=...)): a longer save kills the job
        dist.barrier()


def resume(args: argparse.Namespace, world: DistInfo, training: Training, steps_per_epoch: int) -> Position:
    """Load the latest good checkpoint into the unwrapped model and its helpers; where to continue."""
    # weights_only=True: a checkpoint is data, and unpickling arbitrary objects can run code.
    # map_location: tensors land on this rank's device, not on the device that saved them.
    # rank 0 picks the file and tells the others: each listing the folder could pick another one
    ckpt, path = load_latest_on_every_rank(args.checkpoint_dir, map_location=world.device)
    if ckpt is None:
        if world.is_main:
            print(f"no checkpoint in {args.checkpoint_dir}: starting from scratch")
        return Position()
    training.raw_model.load_state_dict(ckpt["model"])
    parts = {"optimizer": training.optimizer, "scheduler": training.scheduler, "scaler": training.scaler}
    for part, target in parts.items():
        if part not in args.resume_ignore:
            target.load_state_dict(ckpt[part])
    if "optimizer" in args.resume_ignore and "scheduler" not in args.resume_ignore:
        # the current lr lives in the optimizer's state: put the schedule's back, so that only
        # the momentum buffers are lost
        for group, lr in zip(training.optimizer.param_groups, training.scheduler.get_last_lr(), strict=True):
            group["lr"] = lr
    if "rng" not in args.resume_ignore:
        states = ckpt["rng"]
        if len(states) == world.world_size:
            restore_rng(states[world.rank])
        elif world.is_main:  # another world size: each rank keeps its fresh seed + rank generator
            print(
                f"the checkpoint holds {len(states)} RNG states for {world.world_size} ranks: not restoring them"
            )
    pos = Position(ckpt["step"], ckpt["epoch"], ckpt["batch_in_epoch"])
    if ckpt["world_size"] != world.world_size:
        # the world changed size: keep the position in samples, not in per-rank batches
        done = pos.batch_in_epoch * ckpt["batch_size"] * ckpt["world_size"]
        pos.batch_in_epoch = done // (args.batch_size * world.world_size)
    if pos.batch_in_epoch >= steps_per_epoch:
        pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0  # saved at the end of an epoch
    if world.is_main:
        ignored = f" (ignoring {', '.join(args.resume_ignore)})" if args.resume_ignore else ""
        print(
            f"resumed from {path.name}: step {pos.step}, epoch {pos.epoch}, batch {pos.batch_in_epoch}{ignored}"
        )
    return pos


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
