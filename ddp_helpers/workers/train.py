"""Train an image classifier on one device, with DataParallel, or with DDP.

    python train.py --mode single --steps 50
    python train.py --mode dp --steps 50                 # one process, all visible GPUs
    torchrun --nproc-per-node 2 train.py --steps 50      # DDP, one process per GPU (or 2 on the CPU)

Each rank appends one JSON line per logged step to <run-dir>/metrics/rank{R}.jsonl, and
rank 0 writes <run-dir>/summary.json at the end. The notebooks read those files.
"""

import argparse
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset

from ddp_helpers import teardown
from ddp_helpers.checkpoint import capture_rng, load_latest, restore_rng, save_checkpoint
from ddp_helpers.data import DATASETS, ResumableDistributedSampler, build_dataset
from ddp_helpers.distributed import DistInfo, setup_distributed
from ddp_helpers.metrics import MetricsWriter

# -----------------------------------------------------------------------------
# config

# what --resume-ignore can leave out of a resume: each name drops that state and nothing else
RESUME_PARTS = ("rng", "optimizer", "scheduler", "scaler")


def parse_args(argv=None):
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
    p.add_argument(
        "--eval", action="store_true", help="report accuracy on the dataset's test split at the end"
    )
    p.add_argument("--save-final", default=None, help="write the plain (non-DDP) model state_dict here")
    p.add_argument("--checkpoint-dir", default=None, help="save checkpoints here (rank 0 writes, atomically)")
    p.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-checkpoints", type=int, default=3, help="how many recent checkpoints to keep")
    p.add_argument("--resume", action="store_true", help="continue from the latest good checkpoint, if any")
    p.add_argument("--resume-ignore", nargs="*", choices=RESUME_PARTS, default=[],
                   help="teaching aid: resume without these parts (each names exactly one), to watch the run drift")  # fmt: skip
    p.add_argument("--stop-at-step", type=int, default=None, help="stop after this step, as if interrupted")
    p.add_argument("--fail-at-step", type=int, default=None, help="fault injection: raise at this step...")
    p.add_argument("--fail-rank", type=int, default=0, help="...on this rank (first attempt only)")
    p.add_argument(
        "--tensorboard", action="store_true", help="also write TensorBoard scalars to <run-dir>/tensorboard"
    )
    p.add_argument("--run-dir", default=os.environ.get("DDP_RUN_DIR", "runs/train"))
    args = p.parse_args(argv)
    if args.tensorboard and not tensorboard_installed():
        p.error("--tensorboard needs the tensorboard package: pip install tensorboard")
    if args.mode in ("single", "dp") and int(os.environ.get("WORLD_SIZE", 1)) > 1:
        p.error(f"--mode {args.mode} is one process; start it with python, not torchrun --nproc-per-node > 1")
    if args.mode == "ddp" and not under_torchrun:
        p.error(
            "--mode ddp needs torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR): torchrun --nproc-per-node 2 train.py"
        )
    if args.resume and not args.checkpoint_dir:
        p.error("--resume needs --checkpoint-dir")
    for name in ("batch_size", "epochs", "log_every", "save_every", "keep_checkpoints", "steps", "stop_at_step"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


# -----------------------------------------------------------------------------
# helpers


def build_model(name, shape, num_classes, hidden, dropout=0.0):
    if name == "mlp":
        c, h, w = shape
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * h * w, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )  # fmt: skip
    import torchvision  # here, not at the top: it takes seconds to import and the MLP needs none of it

    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)  # no download: offline
    if shape[0] != 3:
        model.conv1 = nn.Conv2d(shape[0], 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def evaluate(model, dataset, rank, world_size, device, amp_dtype, batch_size):
    """Accuracy over the whole test split, exact under DDP.

    Each rank scores rank::world_size, with no padding, and the counts are summed. (A
    DistributedSampler would pad with repeated samples when the size does not divide.)
    """
    shard = Subset(dataset, range(rank, len(dataset), world_size))
    counts = torch.zeros(2, device=device)  # correct, seen
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        for x, y in DataLoader(shard, batch_size=batch_size):
            x, y = x.to(device), y.to(device)
            counts[0] += (model(x).argmax(dim=1) == y).sum()
            counts[1] += len(y)
    if dist.is_initialized():
        dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item(), int(counts[1].item())


def synchronize(device):
    # CUDA kernels run asynchronously: without this a timer measures the launch, not the work
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tensorboard_installed():
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def open_tensorboard(run_dir):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(os.path.join(run_dir, "tensorboard"))


def peak_memory(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    # ru_maxrss is in KiB on Linux: the whole process's peak resident set, not just tensors
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu_peak_rss"


# -----------------------------------------------------------------------------
# main


@record  # on failure torchelastic writes this rank's traceback to its error file
def main():
    args = parse_args()
    t_start = time.time()

    # ---- process group: one process per device under torchrun
    ddp = args.mode == "ddp"
    if ddp:
        # nccl for GPUs, gloo for CPUs (the launcher says which through DDP_BACKEND); the
        # device comes from LOCAL_RANK, and init_process_group gets it as device_id on GPUs
        info = setup_distributed()
    else:
        use_cuda = torch.cuda.is_available() and os.environ.get("DDP_DEVICE", "cuda") != "cpu"
        info = DistInfo(0, 0, 1, 1, "none", torch.device("cuda" if use_cuda else "cpu"))
    backend, rank, local_rank, world_size, device = (
        info.backend, info.rank, info.local_rank, info.world_size, info.device
    )  # fmt: skip
    master_process = rank == 0  # prints, plans and summaries come from rank 0 only

    run(args, ddp, backend, rank, local_rank, world_size, device, master_process, t_start)


def run(args, ddp, backend, rank, local_rank, world_size, device, master_process, t_start):
    # same seed on every rank: identical initial weights (DDP broadcasts rank 0's anyway)
    torch.manual_seed(args.seed)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = device.type == "cuda"
    if args.amp == "fp16" and device.type != "cuda":
        raise SystemExit("--amp fp16 needs a CUDA GPU: on the CPU use --amp bf16 (no loss scaling needed)")

    # ---- data: every mode goes through a DistributedSampler (num_replicas=1 without DDP), so
    # N ranks at batch B see exactly the samples one process sees at batch N*B
    channels = 3 if args.model.startswith("resnet") else 1 if args.dataset == "digits" else 3
    info = build_dataset(args.dataset, num_samples=args.num_samples, image_size=args.image_size,
                         channels=channels, seed=args.seed)  # fmt: skip
    sampler = ResumableDistributedSampler(info.dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                          seed=args.seed, drop_last=True)  # fmt: skip
    loader = DataLoader(
        info.dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
        num_workers=args.num_workers, persistent_workers=args.num_workers > 0,
        pin_memory=device.type == "cuda",  # page-locked host memory makes non_blocking copies real
        generator=torch.Generator().manual_seed(args.seed + rank),  # worker seeds: per rank, apart from the model's
    )  # fmt: skip
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise SystemExit(
            f"{len(info.dataset)} samples are too few for batch {args.batch_size} x {world_size} ranks"
        )
    total_steps = args.steps or args.epochs * steps_per_epoch

    # ---- model, optimizer, schedule, loss scaler
    model = build_model(args.model, info.shape, info.num_classes, args.hidden, args.dropout).to(device)
    memory_format = (
        torch.channels_last if device.type == "cuda" and args.model != "mlp" else torch.contiguous_format
    )
    model = model.to(memory_format=memory_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.lr_schedule == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    else:
        scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    # fp16 has a narrow range: scale the loss so small gradients do not flush to zero
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")

    # the same seed built the same weights on every rank; from here on each rank draws its own
    # dropout masks (and its DataLoader workers their own augmentations): seed + rank
    torch.manual_seed(args.seed + rank)

    # ---- resume before wrapping: DDP then broadcasts the restored weights from rank 0
    step, epoch, batch_in_epoch = 0, 0, 0
    if args.resume:
        step, epoch, batch_in_epoch = resume(args, model, optimizer, scheduler, scaler, rank, world_size,
                                             device, steps_per_epoch)  # fmt: skip

    raw_model = model
    if ddp:
        # gradient_as_bucket_view: grads live inside DDP's all-reduce buckets, saving a copy
        model = DDP(
            model, device_ids=[local_rank] if device.type == "cuda" else None, gradient_as_bucket_view=True
        )
    elif args.mode == "dp":
        if master_process and torch.cuda.device_count() < 2:
            print(
                f"DataParallel sees {torch.cuda.device_count()} GPU(s): it runs the module on one device, unsplit"
            )
        model = nn.DataParallel(model)

    writer = MetricsWriter(args.run_dir, rank)
    writer.write_plan(total_steps, mode=args.mode, world_size=world_size)
    tensorboard = open_tensorboard(args.run_dir) if args.tensorboard and master_process else None
    if master_process:
        print(f"{args.mode}: world_size={world_size} backend={backend} device={device} model={args.model} "
              f"dataset={info.name} batch={args.batch_size}/rank steps={total_steps}"
              + (f" (resuming at step {step})" if step else ""))  # fmt: skip
    if ddp:  # every rank trains on a shard of its own, and says which
        print(f"rank {rank} of {world_size} on {device}: {len(sampler)} of {len(info.dataset)} samples per epoch, "
              f"{steps_per_epoch} steps")  # fmt: skip

    # ---- training loop
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    stop_step = min(total_steps, args.stop_at_step or total_steps)
    skipped_steps, last_scale = 0, None
    window_start, window_step, step_times = None, step, []
    loss = torch.zeros((), device=device)
    model.train()
    while step < stop_step:
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same one on every rank
        sampler.start_at(batch_in_epoch * args.batch_size)  # after a mid-epoch resume: the very next batch
        for x, y in loader:
            x = x.to(device, non_blocking=True, memory_format=memory_format)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()  # DDP all-reduces gradient buckets during backward
            scaler.step(optimizer)  # skipped, and the scale halved, if any gradient is inf/NaN
            scaler.update()
            scheduler.step()
            step += 1
            batch_in_epoch += 1

            if args.fail_at_step == step and rank == args.fail_rank and attempt == 0:
                raise RuntimeError(f"injected fault on rank {rank} at step {step}")

            if step == args.warmup_steps or (window_start is None and step > args.warmup_steps):
                synchronize(device)
                window_start, window_step = time.perf_counter(), step
            if step % args.log_every == 0 or step == stop_step:
                synchronize(device)  # the one sync per log window: timing needs it
                now = time.perf_counter()
                step_time = None
                if window_start is not None and step > window_step and step > args.warmup_steps:
                    step_time = (now - window_start) / (step - window_step)
                    step_times.extend([step_time] * (step - window_step))
                    window_start, window_step = now, step
                loss_value, lr = loss.item(), optimizer.param_groups[0]["lr"]
                scale = scaler.get_scale() if scaler.is_enabled() else None
                if scale is not None and last_scale is not None and scale < last_scale:
                    skipped_steps += (
                        1  # the scale only drops when a step was skipped (exact with --log-every 1)
                    )
                last_scale = scale
                writer.log(step=step, epoch=epoch, loss=loss_value, samples=step * args.batch_size,
                           global_samples=step * args.batch_size * world_size, step_time_s=step_time,
                           lr=lr, grad_scale=scale, attempt=attempt)  # fmt: skip
                if tensorboard:
                    tensorboard.add_scalar("loss", loss_value, step)
                    tensorboard.add_scalar("lr", lr, step)
                    if step_time:
                        tensorboard.add_scalar(
                            "samples_per_s", args.batch_size * world_size / step_time, step
                        )

            if args.checkpoint_dir and (step % args.save_every == 0 or step == stop_step):
                save(args, raw_model, optimizer, scheduler, scaler, step, epoch, batch_in_epoch,
                     ddp, master_process, world_size)  # fmt: skip
            if step >= stop_step:
                break
        else:
            epoch, batch_in_epoch = epoch + 1, 0  # the epoch ran to its end

    # ---- results
    final_loss = loss.detach().float().clone()
    if ddp:
        dist.all_reduce(final_loss, op=dist.ReduceOp.SUM)  # SUM then divide: every backend has SUM
        final_loss /= world_size
    accuracy, eval_samples = None, 0
    if args.eval:
        test = build_dataset(args.dataset, num_samples=max(256, args.num_samples // 4), image_size=args.image_size,
                             channels=channels, seed=args.seed, split="test")  # fmt: skip
        accuracy, eval_samples = evaluate(
            raw_model, test.dataset, rank, world_size, device, amp_dtype, args.batch_size
        )
    peak_bytes, peak_kind = peak_memory(device)
    median_step = statistics.median(step_times) if step_times else None
    global_batch = args.batch_size * world_size
    if master_process:
        if args.save_final:
            torch.save(
                raw_model.state_dict(), args.save_final
            )  # no "module." prefix: loads into a plain model
        writer.write_summary({
            "mode": args.mode, "world_size": world_size, "backend": backend, "device": str(device),
            "amp": args.amp, "model": args.model, "dataset": info.name,
            "batch_size": args.batch_size, "global_batch_size": global_batch, "steps": step, "epochs": round(step / steps_per_epoch, 3),
            "lr": args.lr, "seed": args.seed, "deterministic": args.deterministic, "attempt": attempt,
            "samples_per_s": global_batch / median_step if median_step else None,
            "samples_per_s_per_rank": args.batch_size / median_step if median_step else None,
            "step_time_median_s": median_step, "timed_steps": len(step_times),
            "peak_mem_bytes": peak_bytes, "peak_mem_kind": peak_kind,
            "final_loss": final_loss.item(), "eval_accuracy": accuracy, "eval_samples": eval_samples,
            "grad_scale": scaler.get_scale() if scaler.is_enabled() else None,
            "skipped_steps": skipped_steps, "num_threads": torch.get_num_threads(),
            "torch_version": torch.__version__, "wall_s": time.time() - t_start,
        })  # fmt: skip
        scored = f", test accuracy {accuracy:.1%} on {eval_samples} samples" if args.eval else ""
        print(f"done: {step} steps, final loss {final_loss.item():.4f}{scored}")
    writer.close()
    if tensorboard:
        tensorboard.close()
    if ddp:
        dist.barrier()  # nobody tears the group down while rank 0 still writes


# -----------------------------------------------------------------------------
# checkpoints: everything needed to continue as if nothing had happened


def save(
    args, model, optimizer, scheduler, scaler, step, epoch, batch_in_epoch, ddp, master_process, world_size
):
    rng = capture_rng()
    rng_per_rank = [rng]
    if ddp:
        # every rank has its own generator states: collect them all (every rank must take part)
        rng_per_rank = [None] * world_size
        dist.all_gather_object(rng_per_rank, rng)
    if master_process:  # one writer: N ranks writing one file would corrupt it
        path = save_checkpoint({
            "model": model.state_dict(),  # the plain module's: no "module." prefix
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
            "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "world_size": world_size,
            "batch_size": args.batch_size, "rng": rng_per_rank, "config": vars(args),
        }, args.checkpoint_dir, step, keep=args.keep_checkpoints)  # fmt: skip
        print(f"checkpoint saved: {path.name}")
    if ddp:
        dist.barrier()  # no rank races ahead (or reads) before the file is complete


def resume(args, model, optimizer, scheduler, scaler, rank, world_size, device, steps_per_epoch):
    # weights_only=True: a checkpoint is data, and unpickling arbitrary objects can run code.
    # map_location: tensors land on this rank's device, not on the device that saved them.
    ckpt, path = load_latest(args.checkpoint_dir, map_location=device)
    if ckpt is None:
        if rank == 0:
            print(f"no checkpoint in {args.checkpoint_dir}: starting from scratch")
        return 0, 0, 0
    model.load_state_dict(ckpt["model"])
    for part, target in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler)):
        if part not in args.resume_ignore:
            target.load_state_dict(ckpt[part])
    if "optimizer" in args.resume_ignore and "scheduler" not in args.resume_ignore:
        # the current lr lives in the optimizer's state: put the schedule's back, so that only
        # the momentum buffers are lost
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
            group["lr"] = lr
    if "rng" not in args.resume_ignore:
        states = ckpt["rng"]
        if len(states) == world_size:
            restore_rng(states[rank])
        elif rank == 0:  # another world size: each rank keeps its fresh seed + rank generator
            print(f"the checkpoint holds {len(states)} RNG states for {world_size} ranks: not restoring them")
    step, epoch, batch_in_epoch = ckpt["step"], ckpt["epoch"], ckpt["batch_in_epoch"]
    if ckpt["world_size"] != world_size:
        # the world changed size: keep the position in samples, not in per-rank batches
        done = batch_in_epoch * ckpt["batch_size"] * ckpt["world_size"]
        batch_in_epoch = done // (args.batch_size * world_size)
    if batch_in_epoch >= steps_per_epoch:
        epoch, batch_in_epoch = epoch + 1, 0  # saved at the end of an epoch
    if rank == 0:
        ignored = f" (ignoring {', '.join(args.resume_ignore)})" if args.resume_ignore else ""
        print(f"resumed from {path.name}: step {step}, epoch {epoch}, batch {batch_in_epoch}{ignored}")
    return step, epoch, batch_in_epoch


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
