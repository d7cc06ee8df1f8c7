"""Matplotlib figures for the notebooks. Each function takes measured data and returns the Figure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def allreduce_bandwidth(results: Sequence[dict[str, Any]], title: str = "all_reduce bandwidth"):
    """algbw and busbw (GB/s) against message size, from allreduce_bench's summary["results"]."""
    import matplotlib.pyplot as plt

    sizes = [r["bytes"] for r in results]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(sizes, [r["algbw_gbps"] for r in results], "o-", label="algbw (bytes / time)")
    ax.plot(sizes, [r["busbw_gbps"] for r in results], "s--", label="busbw (algbw x 2(n-1)/n)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def throughput_by_mode(table, title: str = "throughput by mode"):
    """Bar chart of samples/s, one bar per row of a results table (index = mode name)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    bars = ax.bar(table.index.astype(str), table["samples_per_s"], color="#4c72b0")
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("samples / s")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def scaling_curve(nprocs, samples_per_s, title: str = "DDP scaling"):
    """Measured throughput over 1..N processes, with the ideal N x throughput_1 line."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ideal = [n * samples_per_s[0] / nprocs[0] for n in nprocs]
    ax.plot(nprocs, ideal, "k--", label="ideal (linear)")
    ax.plot(nprocs, samples_per_s, "o-", label="measured")
    ax.set_xticks(list(nprocs))
    ax.set_xlabel("processes")
    ax.set_ylabel("samples / s")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def step_time_per_rank(metrics, title: str = "step time per rank"):
    """Each rank's timed step windows: a straggler shows as one line above the others."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    timed = metrics.dropna(subset=["step_time_s"])
    for rank, rows in timed.groupby("rank"):
        ax.plot(rows["step"], rows["step_time_s"] * 1e3, marker=".", label=f"rank {rank}")
    ax.set_xlabel("step")
    ax.set_ylabel("ms / step")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def loss_curves(runs, x: str = "samples_seen", title: str = "training loss"):
    """One line per run: `runs` maps a label to a metrics DataFrame (rank 0's rows are used)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, metrics in runs.items():
        rows = metrics[metrics["rank"] == 0]
        ax.plot(rows[x], rows["loss"], label=label)
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def resource_usage(resources, title: str = "per-rank CPU use"):
    """CPU % per rank over the run (and GPU utilisation per GPU where sampled)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    if "rank" in resources:
        for rank, rows in resources.dropna(subset=["rank"]).groupby("rank"):
            ax.plot(rows["elapsed_s"], rows["cpu_percent"], label=f"rank {int(rank)} CPU %")
    if "gpu" in resources:
        for gpu, rows in resources.dropna(subset=["gpu"]).groupby("gpu"):
            ax.plot(rows["elapsed_s"], rows["gpu_util_percent"], "--", label=f"GPU {int(gpu)} util %")
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("%")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig
