"""Train an image classifier on one device, with DataParallel, or with DDP (train.py's command line).

    python train.py --mode single --steps 50
    python train.py --mode dp --steps 50                 # one process, all visible GPUs
    torchrun --nproc-per-node 2 train.py --steps 50      # DDP, one process per GPU (or 2 on the CPU)

Each rank appends one JSON line per logged step to <run-dir>/metrics/rank{R}.jsonl, and rank 0 writes
<run-dir>/summary.json at the end. Every option, its default and its check, are here: a bad value is
refused before any process group exists.
"""

from __future__ import annotations

import argparse
import os

from ddp_helpers.rank.data import DATASETS
from ddp_helpers.run_contract import run_dir_from_env

# what --resume-ignore can leave out of a resume: each name drops that state and nothing else
RESUME_PARTS = ("rng", "optimizer", "scheduler", "scaler")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_and_data(p)
    add_optimization(p)
    add_checkpoints(p)
    add_fault_injection(p)
    p.add_argument(
        "--tensorboard", action="store_true", help="also write TensorBoard scalars to <run-dir>/tensorboard"
    )
    p.add_argument("--run-dir", default=run_dir_from_env("runs/train"))
    args = p.parse_args(argv)
    check(p, args)
    return args


def add_model_and_data(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument(
        "--eval", action="store_true", help="report accuracy on the dataset's test split at the end"
    )


def add_optimization(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=None, help="optimizer steps to run (default: --epochs)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    p.add_argument("--dropout", type=float, default=0.0, help="MLP dropout: makes the RNG state matter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--deterministic", action="store_true", help="deterministic kernels: bitwise-repeatable runs"
    )
    p.add_argument("--log-every", type=int, default=10, help="log (and synchronise for timing) every N steps")
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the throughput figure")
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off")
    p.add_argument("--max-grad-norm", type=float, default=None, help="clip the gradient norm (default: off)")


def add_checkpoints(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--save-on-sigterm",
        action="store_true",
        help="on SIGTERM (a preemption notice), save a checkpoint at the next logged step and stop",
    )


def add_fault_injection(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overflow-at-steps", type=int, nargs="*", default=[], help="fault injection: inf grads..."
    )
    p.add_argument("--overflow-rank", type=int, default=0, help="...on this rank, at these steps of its own")
    p.add_argument("--fail-at-step", type=int, default=None, help="fault injection: raise at this step...")
    p.add_argument("--fail-rank", type=int, default=0, help="...on this rank (first attempt only)")
    p.add_argument(
        "--sigterm-at-step", type=int, default=None, help="fault injection: send this process SIGTERM..."
    )
    p.add_argument("--sigterm-rank", type=int, default=0, help="...on this rank, after this step")
    p.add_argument(
        "--straggler",
        type=straggler_spec,
        default=None,
        metavar="RANK:MS",
        help="fault injection: RANK waits MS milliseconds more for each batch, as a slow data loader would",
    )


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what argparse's types cannot: options that contradict each other or the launch."""
    under_torchrun = int(os.environ.get("RANK", -1)) != -1
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if args.tensorboard and not tensorboard_installed():
        p.error("--tensorboard needs the tensorboard package: pip install tensorboard")
    if args.mode in ("single", "dp") and world_size > 1:
        p.error(f"--mode {args.mode} is one process; start it with python, not torchrun --nproc-per-node > 1")
    if args.mode == "ddp" and not under_torchrun:
        p.error(
            "--mode ddp needs torchrun, which sets RANK and WORLD_SIZE: torchrun --nproc-per-node 2 train.py"
        )
    if args.straggler and args.straggler[0] >= world_size:
        p.error(
            f"--straggler {args.straggler[0]}:...: there is no rank {args.straggler[0]} among {world_size}"
        )
    if args.resume and not args.checkpoint_dir:
        p.error("--resume needs --checkpoint-dir")
    if args.save_on_sigterm and not args.checkpoint_dir:
        p.error("--save-on-sigterm needs --checkpoint-dir")
    counts = ("batch_size", "epochs", "steps", "stop_at_step", "log_every", "save_every", "keep_checkpoints")
    for name in counts:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")


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
