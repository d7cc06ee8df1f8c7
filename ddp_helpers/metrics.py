"""What workers write (JSONL per rank, summary.json) and how the notebook reads it back.

Workers use `MetricsWriter`; the launcher follows the files with `MetricsFollower` to drive
the progress bar; notebooks get a pandas DataFrame from `read_metrics`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .log_tail import FileFollower

if TYPE_CHECKING:
    import pandas as pd

METRICS_DIR = "metrics"
SUMMARY_FILE = "summary.json"
PLAN_FILE = "plan.json"


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    # Readers poll these files while the run goes on: never let them see half a file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


class MetricsWriter:
    """Appends one JSON object per logged step to ``<run_dir>/metrics/rank{R}.jsonl``."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        metrics_dir = self.run_dir / METRICS_DIR
        metrics_dir.mkdir(parents=True, exist_ok=True)
        self.path = metrics_dir / f"rank{rank}.jsonl"
        self._fh = open(self.path, "a", buffering=1)  # line-buffered: the launcher tails it live

    def log(self, **fields: Any) -> None:
        record = {"rank": self.rank, "time": time.time(), **fields}
        self._fh.write(json.dumps(record) + "\n")

    def write_plan(self, total_steps: int, **fields: Any) -> None:
        """Tell the launcher how many steps to expect (rank 0 only), for the progress bar."""
        if self.rank == 0:
            _write_json_atomic(self.run_dir / PLAN_FILE, {"total_steps": total_steps, **fields})

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.rank == 0:
            _write_json_atomic(self.run_dir / SUMMARY_FILE, summary)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    import pandas as pd  # here, not at the top: workers import this module for MetricsWriter

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


# ---------------------------------------------------------------------------- maths


def scaling_efficiency(throughput_n: float, throughput_1: float, world_size: int) -> float:
    """throughput_N / (N x throughput_1): 1.0 is perfect linear scaling."""
    if throughput_1 <= 0 or world_size < 1:
        raise ValueError("throughput_1 must be > 0 and world_size >= 1")
    return throughput_n / (world_size * throughput_1)


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' all_reduce bus bandwidth: algbw x 2(n-1)/n, comparable across world sizes."""
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    return algbw * 2 * (world_size - 1) / world_size


def step_time_spread(metrics: pd.DataFrame) -> float | None:
    """(slowest - fastest) / median of the ranks' median step times: 0 means no straggler."""
    if metrics.empty or "step_time_s" not in metrics:
        return None
    per_rank = metrics.dropna(subset=["step_time_s"]).groupby("rank")["step_time_s"].median()
    if per_rank.empty:
        return None
    return float((per_rank.max() - per_rank.min()) / per_rank.median())


def results_table(runs: dict[str, Any], baseline: str) -> pd.DataFrame:
    """One row per run (LaunchResult-like: .summary and .metrics), with efficiency against `baseline`.

    Scaling efficiency = throughput_N / (N x throughput_1), with the baseline as throughput_1.
    """
    import pandas as pd

    base = runs[baseline].summary["samples_per_s"]
    rows = {}
    for name, run in runs.items():
        summary = run.summary
        n = summary["world_size"]
        rows[name] = {
            "processes": n,
            "samples_per_s": summary["samples_per_s"],
            "samples_per_s_per_rank": summary["samples_per_s"] / n,
            "scaling_efficiency": scaling_efficiency(summary["samples_per_s"], base, n),
            "peak_mem_MiB": summary["peak_mem_bytes"] / 2**20,
            "peak_mem_kind": summary["peak_mem_kind"],
            "step_time_spread": step_time_spread(run.metrics),
            "threads_per_process": summary.get("num_threads"),
        }
    return pd.DataFrame.from_dict(rows, orient="index")
