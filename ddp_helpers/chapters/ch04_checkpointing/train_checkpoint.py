"""train.py's checkpoints: everything needed to continue as if nothing had happened. The file format and
its atomic write are ddp_helpers/chapters/ch04_checkpointing/checkpoint.py.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ddp_helpers.chapters.ch04_checkpointing.checkpoint import (
    capture_rng,
    load_latest_on_every_rank,
    restore_rng,
    save_checkpoint,
)
from ddp_helpers.rank.distributed import DistInfo
from ddp_helpers.workers.train_state import Position, Training

if TYPE_CHECKING:
    from torch.distributed.checkpoint.stateful import Stateful  # has state_dict() and load_state_dict()


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
    if ckpt is None or path is None:  # both, or neither
        if world.is_main:
            print(f"no checkpoint in {args.checkpoint_dir}: starting from scratch")
        return Position()
    # every rank says where its copy landed: without map_location, all would land on the saver's GPU
    print(
        f"rank {world.rank}: checkpoint {path.name} loaded onto {next(iter(ckpt['model'].values())).device}"
    )
    training.raw_model.load_state_dict(ckpt["model"])
    parts: dict[str, Stateful]
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


class Preemption:
    """--save-on-sigterm: a preempted job gets SIGTERM, then SIGKILL a grace period later.

    The handler only sets a flag; `agreed()` all-reduces the flags (MAX), so every rank saves at one step.
    """

    def __init__(self, enabled: bool) -> None:
        # a signal handler can only be set from the main thread (live ranks may run main() elsewhere)
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self.stopped_at_step: int | None = None
        self._previous = signal.getsignal(signal.SIGTERM)  # until __enter__ replaces it

    def __enter__(self) -> Preemption:
        if self.enabled:
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:  # the process's own SIGTERM handling comes back once training is over
            signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.requested = True  # nothing more in a handler: the loop saves, between two steps

    def agreed(self, world: DistInfo) -> bool:
        """Whether any rank was asked to stop; every rank must call it at the same step (a collective)."""
        if not self.enabled:
            return False
        if not world.distributed:
            return self.requested
        flag = torch.tensor(float(self.requested), device=world.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
