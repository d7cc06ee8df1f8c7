"""Follow and read what the ranks write (`ddp_helpers.metrics`): live during a run, whole after it.

A run_dir used again keeps the earlier launch's outputs aside (`keep_previous_outputs`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..metrics import METRICS_DIR, PLAN_FILE, SUMMARY_FILE
from ..run_contract import RUN_OUTPUTS
from .log_follow import FileFollower

if TYPE_CHECKING:
    import pandas as pd

# What one launch writes into its run_dir; a later launch into the same folder moves them aside.


class MetricsFollower:
    """Reads new lines of every rank's JSONL file as they are appended (with `FileFollower`)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.metrics_dir = Path(run_dir) / METRICS_DIR
        self.plan_path = Path(run_dir) / PLAN_FILE
        self._files: dict[Path, FileFollower] = {}

    def read_new(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for path in sorted(self.metrics_dir.glob("rank*.jsonl")):
            follower = self._files.setdefault(path, FileFollower(path))
            for line in follower.read().lines:  # a line still being written waits
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return records

    def total_steps(self) -> int | None:
        try:
            return int(json.loads(self.plan_path.read_text())["total_steps"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


def read_metrics(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """All ranks' logged steps as one DataFrame, sorted by rank and step (empty if none)."""
    import pandas as pd  # here: a launch without a metrics table never pays for pandas

    rows: list[dict[str, Any]] = []
    for path in sorted((Path(run_dir) / METRICS_DIR).glob("rank*.jsonl")):
        with open(path) as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    frame = pd.DataFrame(rows)
    if not frame.empty and {"rank", "step"} <= set(frame.columns):
        frame = frame.sort_values(["rank", "step"], kind="stable")
        # after an elastic restart the steps since the last checkpoint are logged twice: keep the rerun
        frame = frame.drop_duplicates(subset=["rank", "step"], keep="last").reset_index(drop=True)
    return frame


def read_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The summary rank 0 wrote at the end, or {} if the run never got there."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def keep_previous_outputs(run_dir: Path) -> Path | None:
    """Move an earlier launch's logs, metrics and summary in `run_dir` to ``run_dir/previous/<n>``.

    A launch reads only its own files: a reused run_dir must not report the earlier run's failure,
    lines or summary. Other files (checkpoints, the magic's cell.py) stay where they are.
    """
    found = [run_dir / name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not found:
        return None
    previous = run_dir / "previous"
    index = 1 + max((int(p.name) for p in previous.glob("*") if p.name.isdigit()), default=0)
    target = previous / str(index)
    target.mkdir(parents=True)
    for path in found:
        shutil.move(str(path), str(target / path.name))
    return target
