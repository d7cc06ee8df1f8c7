"""Train an image classifier on one device (--mode single), with DataParallel (dp), or with DDP:
``python train.py --mode single --steps 50``; ``torchrun --nproc-per-node 2 train.py --steps 50``.
Each rank writes <run-dir>/metrics/rank{R}.jsonl, rank 0 <run-dir>/summary.json. Read it from `main()` down."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset

from ddp_helpers.chapters.ch04_checkpointing.train_checkpoint import Preemption, resume, save
from ddp_helpers.rank import teardown
from ddp_helpers.rank.data import DATASETS, ResumableDistributedSampler, build_dataset
from ddp_helpers.rank.distributed import DistInfo, setup_distributed, under_torchrun
from ddp_helpers.run_contract import DEVICE_ENV, run_dir_from_env
from ddp_helpers.workers.train_report import Reporter, inject_overflow, mean_over_ranks, summarize
from ddp_helpers.workers.train_state import Data, Position, Run, Training

__all__ = ["RESUME_PARTS", "build_model", "main", "parse_args", "train_step"]


def setup(args: argparse.Namespace) -> DistInfo:
    """Join the process group under DDP; describe the one process otherwise."""
    if args.mode == "ddp":
        # init_process_group: nccl for GPUs, gloo for CPUs (DDP_BACKEND), on the rank's own cuda:LOCAL_RANK
        return setup_distributed()
    use_cuda = torch.cuda.is_available() and os.environ.get(DEVICE_ENV, "cuda") != "cpu"
    return DistInfo(0, 0, 1, 1, "none", torch.device("cuda" if use_cuda else "cpu"))


def build_data(args: argparse.Namespace, world: DistInfo) -> Data:
    """A DistributedSampler in every mode (one replica without DDP): N ranks at batch B see what one sees at N*B."""
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
    return Data(info.dataset, info.shape, info.num_classes, info.name, sampler, loader)


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
    model = model.to(device)
    model = model.to(memory_format=memory_format)
    # from here on each rank draws its own dropout masks: seed + rank
    torch.manual_seed(args.seed + world.rank)

    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler: torch.optim.lr_scheduler.LRScheduler
    if args.lr_schedule == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    else:
        scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    # fp16 has a narrow range: scale the loss so small gradients do not flush to zero. On the CPU
    # too: CPU autocast takes float16 and GradScaler("cpu") exists (torch 2.7 and later)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    training = Training(
        model, model, optimizer, scheduler, scaler, amp_dtype, memory_format, device, args.max_grad_norm
    )
    if args.overflow_at_steps:  # every rank counts its own overflows; one rank makes them
        own_steps = set(args.overflow_at_steps) if world.rank == args.overflow_rank else set()
        training.local_overflows = inject_overflow(model, own_steps)
    return training


def wrap(args: argparse.Namespace, world: DistInfo, training: Training) -> None:
    """DDP: one process per device, gradients averaged during backward. DP: one process, all GPUs."""
    if args.mode == "ddp":
        on_gpu = world.device.type == "cuda"
        # gradient_as_bucket_view: grads live inside DDP's all-reduce buckets, saving a copy
        training.model = DDP(
            training.raw_model,
            device_ids=[world.device] if on_gpu else None,
            gradient_as_bucket_view=True,
        )
    elif args.mode == "dp":
        gpus = torch.cuda.device_count()
        if gpus < 2:
            print(f"DataParallel sees {gpus} GPU(s): it runs the module on one device, unsplit")
        training.model = nn.DataParallel(training.raw_model)


# ----------------------------------------------------------------------------- the loop
def train_step(training: Training, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One optimizer step on one batch; returns the loss (on the device, not synchronised)."""
    device, amp_dtype = training.device, training.amp_dtype
    x = x.to(device, non_blocking=True, memory_format=training.memory_format)
    y = y.to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        logits = training.model(x)  # 16 bits under autocast: the summary reports this dtype
        loss = F.cross_entropy(logits, y)  # autocast computes the loss in fp32
    training.output_dtype = logits.dtype
    training.optimizer.zero_grad(set_to_none=True)
    # fp16: the loss times the scale, so small gradients stay above fp16's smallest number; DDP
    # all-reduces the gradient buckets during backward, in the parameters' dtype (fp32)
    training.scaler.scale(loss).backward()
    if training.max_grad_norm is not None:
        # clip the true gradients: divide the scale out first (in place; step() won't again)
        training.scaler.unscale_(training.optimizer)
        # the norm the clip measured (before clipping) is logged: scaled gradients would show in it
        training.grad_norm = torch.nn.utils.clip_grad_norm_(
            training.model.parameters(), training.max_grad_norm
        )
    scale = training.scaler.get_scale()  # 1.0 without a scaler; else a sync, as step() makes one
    training.scaler.step(training.optimizer)  # no optimizer.step() if any gradient is inf/NaN...
    training.scaler.update()  # ...and then the scale shrinks: that marks every skipped step
    training.skipped_steps += int(training.scaler.get_scale() < scale)
    training.scheduler.step()
    return loss


def train(run: Run, reporter: Reporter, preemption: Preemption) -> torch.Tensor:
    """Run steps until `reporter.last_step` (or a SIGTERM, with --save-on-sigterm); the last loss."""
    args, world, data, training, pos = run.args, run.world, run.data, run.training, run.pos
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
            if args.fail_at_step == pos.step and world.rank == args.fail_rank and reporter.attempt == 0:
                raise RuntimeError(f"injected fault on rank {world.rank} at step {pos.step}")
            if args.sigterm_at_step == pos.step and world.rank == args.sigterm_rank:
                os.kill(os.getpid(), signal.SIGTERM)  # injected: a scheduler's preemption notice, to one rank
            reporter.after_step(pos, loss, training)
            saved = args.checkpoint_dir and (
                pos.step % args.save_every == 0 or pos.step == reporter.last_step
            )
            if saved:
                save(args, world, training, pos)
            # told to stop (SIGTERM)? Asked on logged steps only, where the loop synchronises anyway
            if reporter.logs(pos.step) and preemption.agreed(world):
                if not saved:
                    save(args, world, training, pos)
                preemption.stopped_at_step = pos.step
                if world.is_main:
                    print(f"SIGTERM: checkpoint saved at step {pos.step}; stopping")
                return loss
            if pos.step >= reporter.last_step:
                break
            reporter.phases.start(timed=reporter.logs(pos.step + 1))
        else:
            pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0  # the epoch ran to its end
    return loss


# ----------------------------------------------------------------------------- results
def evaluate(
    training: Training, dataset: TensorDataset, world: DistInfo, batch_size: int
) -> tuple[float, int]:
    """Accuracy over the whole test split, exact under DDP, and the number of samples scored."""
    # rank::world_size, no padding (a DistributedSampler would repeat samples when the size does not divide)
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


# ----------------------------------------------------------------------------- main
def announce(run: Run, total_steps: int) -> None:
    args, world, data, pos = run.args, run.world, run.data, run.pos
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


@record  # on failure torchelastic writes this rank's traceback to its error file
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t_start = time.time()
    world = setup(args)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(args.deterministic)  # either way: live ranks run main() again
    torch.backends.cudnn.benchmark = world.device.type == "cuda" and not args.deterministic

    data = build_data(args, world)
    total_steps = args.steps or args.epochs * len(data.loader)
    training = build_training(args, world, data, total_steps)
    # resume before wrapping: DDP then broadcasts the restored weights from rank 0
    pos = resume(args, world, training, len(data.loader)) if args.resume else Position()
    wrap(args, world, training)
    run = Run(args, world, data, training, pos)

    reporter = Reporter(args, world, last_step=min(total_steps, args.stop_at_step or total_steps))
    reporter.writer.write_plan(total_steps, mode=args.mode, world_size=world.world_size)
    announce(run, total_steps)

    with Preemption(args.save_on_sigterm) as preemption:
        loss = train(run, reporter, preemption)

    final_loss = mean_over_ranks(loss, world).item()
    accuracy, eval_samples = None, 0
    if args.eval:
        test = build_dataset(
            args.dataset,
            num_samples=max(256, args.num_samples // 4),
            image_size=args.image_size,
            channels=data.shape[0],
            seed=args.seed,
            split="test",
        )
        accuracy, eval_samples = evaluate(training, test.dataset, world, args.batch_size)
    if world.is_main:
        if args.save_final:  # the plain model's weights: no "module." prefix, loads into a plain model
            torch.save(training.raw_model.state_dict(), args.save_final)
        summary = summarize(run, reporter)
        summary.update(
            final_loss=final_loss,
            eval_accuracy=accuracy,
            eval_samples=eval_samples,
            wall_s=time.time() - t_start,
            preempted_at_step=preemption.stopped_at_step,
        )
        reporter.writer.write_summary(summary)
        scored = f", test accuracy {accuracy:.1%} on {eval_samples} samples" if args.eval else ""
        print(f"done: {pos.step} steps, final loss {final_loss:.4f}{scored}")
    reporter.close()
    if world.distributed:
        dist.barrier()  # nobody tears the group down while rank 0 still writes


# ----------------------------------------------------------------------------- the command line
# what --resume-ignore can leave out of a resume: each name drops that state and nothing else
RESUME_PARTS = ("rng", "optimizer", "scheduler", "scaler")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["single", "dp", "ddp"], default="ddp" if under_torchrun() else "single")
    p.add_argument("--model", choices=["mlp", "resnet18", "resnet50"], default="mlp")
    p.add_argument("--hidden", type=int, default=256, help="width of the MLP's hidden layers")
    p.add_argument("--dataset", choices=DATASETS, default="synthetic")
    p.add_argument("--num-samples", type=int, default=2048, help="synthetic dataset size")
    p.add_argument("--image-size", type=int, default=32, help="synthetic image side, in pixels")
    p.add_argument("--batch-size", type=int, default=32, help="per rank: the global batch is this x ranks")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--eval", action="store_true", help="report accuracy on the test split at the end")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps to run (default: --epochs)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    p.add_argument("--dropout", type=float, default=0.0, help="MLP dropout: makes the RNG state matter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true", help="deterministic kernels: repeatable runs")
    p.add_argument("--log-every", type=int, default=10, help="log (and synchronise for timing) every N steps")
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the throughput figure")
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off")
    p.add_argument("--max-grad-norm", type=float, default=None, help="clip the gradient norm (default: off)")
    p.add_argument("--save-final", default=None, help="write the plain (non-DDP) model state_dict here")
    p.add_argument("--checkpoint-dir", default=None, help="save checkpoints here (rank 0 writes, atomically)")
    p.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-checkpoints", type=int, default=3, help="how many recent checkpoints to keep")
    p.add_argument("--resume", action="store_true", help="continue from the latest good checkpoint, if any")
    p.add_argument("--resume-ignore", nargs="*", choices=RESUME_PARTS, default=[], help="not resumed")
    p.add_argument("--stop-at-step", type=int, default=None, help="stop after this step, as if interrupted")
    p.add_argument("--save-on-sigterm", action="store_true", help="on SIGTERM, save at the next logged step")
    p.add_argument("--overflow-at-steps", type=int, nargs="*", default=[], help="inject inf grads...")
    p.add_argument("--overflow-rank", type=int, default=0, help="...on this rank, at these steps of its own")
    p.add_argument("--fail-at-step", type=int, default=None, help="fault injection: raise at this step...")
    p.add_argument("--fail-rank", type=int, default=0, help="...on this rank (first attempt only)")
    p.add_argument("--sigterm-at-step", type=int, default=None, help="fault injection: SIGTERM...")
    p.add_argument("--sigterm-rank", type=int, default=0, help="...on this rank, after this step")
    p.add_argument("--straggler", type=straggler_spec, metavar="RANK:MS", help="RANK loads MS slower")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard scalars")
    p.add_argument("--run-dir", default=run_dir_from_env("runs/train"))
    args = p.parse_args(argv)
    check(p, args)
    return args


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse options that contradict each other or the launch."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if args.tensorboard and importlib.util.find_spec("tensorboard") is None:
        p.error("--tensorboard needs the tensorboard package: pip install tensorboard")
    if args.mode in ("single", "dp") and world_size > 1:
        p.error(f"--mode {args.mode} is one process; start it with python, not torchrun --nproc-per-node > 1")
    if args.mode == "ddp" and not under_torchrun():
        p.error("--mode ddp needs torchrun, which sets RANK and WORLD_SIZE: torchrun --nproc-per-node 2 ...")
    if args.straggler and args.straggler[0] >= world_size:
        p.error(f"--straggler: there is no rank {args.straggler[0]} among {world_size}")
    for flag in ("resume", "save_on_sigterm"):
        if getattr(args, flag) and not args.checkpoint_dir:
            p.error(f"--{flag.replace('_', '-')} needs --checkpoint-dir")
    counts = ("batch_size", "epochs", "steps", "stop_at_step", "log_every", "save_every", "keep_checkpoints")
    for name in counts:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")


def straggler_spec(text: str) -> tuple[int, float]:
    """--straggler RANK:MS, e.g. 1:40, as (rank, milliseconds)."""
    rank, sep, ms = text.partition(":")
    try:
        spec = int(rank), float(ms)
    except ValueError:
        spec = None
    if not sep or spec is None or spec[0] < 0 or not 0 < spec[1] < 60_000:
        raise argparse.ArgumentTypeError(f"{text!r}: expected RANK:MS, a rank >= 0 and 0 < MS < 60000")
    return spec


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
