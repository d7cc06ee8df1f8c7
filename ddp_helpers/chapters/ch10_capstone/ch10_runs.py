"""One run of the learner's script under torchrun, each rank inside the probe, and what the run left."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_helpers.chapters.ch10_capstone.ch10_contract import (
    PROBE_DATA_ENV,
    PROBE_DIR_ENV,
    RUN_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
)


@dataclass
class Run:
    """What one run left: each rank's probe record, its output, how it ended, and <out>/ckpt.pt loaded."""

    name: str  # "stopped at step 4", "resumed", "uninterrupted"
    out: Path
    records: list[dict[str, Any] | None]  # per rank, the probe's record (None: the rank left none)
    logs: dict[int, list[str]]
    error: str | None = None
    hung: bool = False
    ckpt: dict[str, Any] | None = None
    ckpt_error: str = ""
    lines: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # per rank, the JSON lines printed

    @property
    def ckpt_path(self) -> str:
        return os.path.abspath(self.out / "ckpt.pt")

    def each(self, name: str) -> list[Any]:
        return [(r or {}).get(name) for r in self.records]


LOG_PREFIX = re.compile(r"^\[rank\d+\]:\s*")


def json_lines(lines: list[str]) -> list[dict[str, Any]]:
    """The log lines among a rank's output: JSON objects with a "loss"."""
    found = []
    for line in lines:
        text = LOG_PREFIX.sub("", line).strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                continue
            if isinstance(value, dict) and "loss" in value:
                found.append(value)
    return found


def launch_run(
    probe: Path,
    script: Path,
    args: list[str],
    world: int,
    folder: Path,
    data: Path,
    name: str,
    extra_env: Mapping[str, str] | None = None,
) -> Run:
    """One run of the script under torchrun, each rank inside the probe; failures become part of the Run."""
    import torch

    from ddp_helpers.errors import LaunchFailed, LaunchTimeout, WorkerFailed
    from ddp_helpers.kernel.launcher.runner import launch

    records_dir = folder / "probe"
    records_dir.mkdir(parents=True, exist_ok=True)
    out = Path(args[args.index("--out") + 1])
    run = Run(name, out, [], {})
    env = {**(extra_env or {}), PROBE_DIR_ENV: str(records_dir), PROBE_DATA_ENV: str(data)}
    try:
        result = launch(
            probe,
            script,
            *args,
            nproc=world,
            run_dir=folder / "launch",
            timeout=RUN_TIMEOUT_S,
            startup_timeout=STARTUP_TIMEOUT_S,
            show_ranks="none",
            progress="off",
            env=env,
        )
        run.logs = result.logs
    except WorkerFailed as error:
        run.error, run.logs = str(error), error.logs
    except LaunchTimeout as error:
        run.error, run.hung = str(error), True
    except LaunchFailed as error:
        run.error = str(error)
    for rank in range(world):
        path = records_dir / f"rank{rank}.json"
        try:
            run.records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            run.records.append(None)
    run.lines = {rank: json_lines(lines) for rank, lines in run.logs.items()}
    if os.path.exists(run.ckpt_path):
        try:
            run.ckpt = torch.load(run.ckpt_path, map_location="cpu", weights_only=True)
        except Exception as error:  # a torn or foreign file: the check says so
            run.ckpt_error = f"{type(error).__name__}: {error}"
    return run


def masks_of(run: Run, steps: int, world: int) -> list[list[Any]] | None:
    """[rank][step] -> the dropout mask drawn (a bool tensor), or None where a step has none."""
    import torch

    out = []
    for record in run.records:
        forwards = (record or {}).get("forwards", [])
        if len(forwards) < steps or any("mask" not in f for f in forwards[:steps]):
            return None
        out.append([torch.tensor([c == "1" for c in f["mask"]]).view(f["shape"]) for f in forwards[:steps]])
    return out if len(out) == world else None
