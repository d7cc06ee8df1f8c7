"""The maths on measured runs: scaling efficiency, results tables, phase times."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def scaling_efficiency(throughput_n: float, throughput_1: float, world_size: int) -> float:
    """throughput_N / (N x throughput_1): 1.0 is perfect linear scaling."""
    if throughput_1 <= 0 or world_size < 1:
        raise ValueError("throughput_1 must be > 0 and world_size >= 1")
    return throughput_n / (world_size * throughput_1)


def step_time_spread(metrics: pd.DataFrame) -> float | None:
    """(slowest - fastest) / median of the ranks' median step times: 0 means no straggler."""
    if metrics.empty or "step_time_s" not in metrics:
        return None
    per_rank = metrics.dropna(subset=["step_time_s"]).groupby("rank")["step_time_s"].median()
    if per_rank.empty:
        return None
    return float((per_rank.max() - per_rank.min()) / per_rank.median())


def results_table(runs: dict[str, Any], baseline: str) -> pd.DataFrame:
    """One row per run (LaunchResult-like: .summary and .metrics), with efficiency against `baseline`."""
    import pandas as pd

    base = runs[baseline].summary
    base_per_device = base["samples_per_s"] / _devices(base)
    rows = {}
    for name, run in runs.items():
        summary = run.summary
        devices = _devices(summary)
        per_device_peaks = summary.get("peak_mem_bytes_per_device") or [summary["peak_mem_bytes"]]
        rows[name] = {
            "processes": summary["world_size"],
            "devices": devices,
            "samples_per_s": summary["samples_per_s"],
            "samples_per_s_per_device": summary["samples_per_s"] / devices,
            "scaling_efficiency": scaling_efficiency(summary["samples_per_s"], base_per_device, devices),
            "peak_mem_MiB": max(per_device_peaks) / 2**20,
            "peak_mem_kind": summary["peak_mem_kind"],
            "step_time_spread": step_time_spread(run.metrics),
            "threads_per_process": summary.get("num_threads"),
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def _devices(summary: dict[str, Any]) -> int:
    return int(summary.get("devices") or summary["world_size"])


PHASES = ("data_time_s", "train_step_time_s")


def phase_times(metrics: pd.DataFrame, skip_steps: int = 0) -> pd.DataFrame:
    """Each rank's median phase times (ms) over its timed steps after `skip_steps`."""
    missing = [c for c in ("rank", "step", *PHASES) if c not in metrics]
    if missing:
        raise ValueError(f"no phase timings in these metrics (missing {missing}): train.py writes them")
    timed = metrics[metrics["step"] > skip_steps].dropna(subset=list(PHASES))
    if timed.empty:
        raise ValueError(f"no timed step after step {skip_steps}")
    timed = timed.assign(
        data_ms=timed["data_time_s"] * 1e3,
        train_step_ms=timed["train_step_time_s"] * 1e3,
        wait_ms=(timed["train_step_time_s"] - timed.groupby("step")["train_step_time_s"].transform("min"))
        * 1e3,
        whole_step_ms=(timed["data_time_s"] + timed["train_step_time_s"]) * 1e3,
    )
    per_rank = timed.groupby("rank")
    medians = per_rank[["data_ms", "train_step_ms", "wait_ms"]].median()
    return medians.assign(whole_step_ms=per_rank["whole_step_ms"].mean()).rename_axis("rank")


def straggler(phases: pd.DataFrame) -> int | None:
    """The rank with the longest time before the collectives, if it also waits least (else None)."""
    if len(phases) < 2:
        return None
    slowest, least_waiting = int(phases["data_ms"].argmax()), int(phases["wait_ms"].argmin())  # positions
    return int(phases.index[slowest]) if slowest == least_waiting else None


def loss_start_end(run: Any, last: int = 1) -> tuple[float, float]:
    """A run's first logged loss and the mean of its `last` logged steps, each averaged over ranks."""
    per_step = run.metrics.groupby("step")["loss"].mean()
    if per_step.empty or last < 1:
        raise ValueError(f"need logged losses and last >= 1 (got {len(per_step)} steps, last={last})")
    return float(per_step.iloc[0]), float(per_step.iloc[-last:].mean())
