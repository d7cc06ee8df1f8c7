"""Notebook 01's small helpers: read what single_device.py and ddp.py printed, score a saved model, and
compare what the live ranks hold. The DDP steps themselves stay in the scripts and the notebook's cells."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def run_single(
    script: Path, epochs: int, batch_size: int, lr: float, save: str, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """`python single_device.py ...` as one process, with `env` added (the plan's: GPUs hidden on gloo)."""
    args = ["--epochs", epochs, "--batch-size", batch_size, "--lr", lr, "--save", save]
    command = [sys.executable, str(script), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def losses(text: str) -> list[float]:
    """The per-epoch losses a script printed ("epoch 0: loss 0.1234 (mean over N samples)")."""
    return [float(m) for m in re.findall(r"^epoch \d+: loss ([0-9.]+)", text, flags=re.M)]


def samples_counted(text: str) -> list[int]:
    """How many samples each epoch's printed mean was taken over."""
    return [int(m) for m in re.findall(r"^epoch \d+: .*mean over (\d+) samples", text, flags=re.M)]


def first_drawn(text: str) -> list[list[int]]:
    """The first samples a rank drew each epoch, from ddp.py's log lines."""
    return [[int(i) for i in m.split(",")] for m in re.findall(r"drew samples \[([0-9, ]+)\] first", text)]


def accuracy(weights_file: str, script: Path) -> float:
    """The saved model's accuracy on the scripts' dataset, scored here on the CPU."""
    import torch

    make_dataset = runpy.run_path(str(script))["make_dataset"]  # the script's function, main() not run
    x, y = make_dataset().tensors
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model.load_state_dict(torch.load(weights_file, map_location="cpu"))
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def checksum(tensors: Sequence[Any]) -> float:
    """One number for a list of tensors (their sum, in float64): equal lists give equal checksums."""
    return round(sum(t.double().sum().item() for t in tensors), 6)


def all_equal(per_rank: Sequence[Sequence[Any]]) -> bool:
    """Whether every rank's list of tensors equals rank 0's, exactly."""
    import torch

    return all(
        all(torch.equal(a, b) for a, b in zip(per_rank[0], other, strict=True)) for other in per_rank[1:]
    )


def worst_gap(a: Sequence[Any], b: Sequence[Any]) -> float:
    """The largest absolute difference between two lists of tensors."""
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def mean_over_ranks(per_rank: Sequence[Sequence[Any]]) -> list[Any]:
    """The element-wise mean of every rank's list of tensors."""
    import torch

    return [torch.stack(layer).mean(dim=0) for layer in zip(*per_rank, strict=True)]
