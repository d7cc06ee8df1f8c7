"""The state of one train.py run (built in train.py, saved by train_checkpoint.py, reported on by
train_report.py): here, apart from all three, so that none imports another."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from ddp_helpers.rank.data import DatasetInfo, ResumableDistributedSampler
from ddp_helpers.rank.distributed import DistInfo


@dataclass
class Data(DatasetInfo):
    """The dataset, and this rank's sampler and loader over it."""

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
    # what the last step measured, for the reports: the dtype autocast gave the model's output,
    # and the gradient norm the clip saw (a tensor on the device: read only when logged)
    output_dtype: torch.dtype | None = None
    grad_norm: torch.Tensor | None = None
    # with --overflow-at-steps: how many of this rank's own gradients (before the all-reduce) were inf/NaN
    local_overflows: torch.Tensor | None = None


@dataclass
class Position:
    """Where the run is: with the states above, all a checkpoint needs to continue exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0


@dataclass
class Run:
    """One run: its options, its process group, its data, its model and where it is."""

    args: argparse.Namespace
    world: DistInfo
    data: Data
    training: Training
    pos: Position
