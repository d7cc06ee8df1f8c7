"""Matplotlib figures for the notebooks. Each function takes measured data and returns the Figure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _axes(size: tuple[float, float], xlabel: str, ylabel: str, title: str) -> Any:
    """A new figure's one set of axes, labelled."""
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=size)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    return ax


def _finish(ax: Any) -> Any:
    """The legend, where anything is labelled, and a tight layout: the figure."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    ax.figure.tight_layout()
    return ax.figure


def allreduce_bandwidth(results: Sequence[dict[str, Any]], title: str = "all_reduce bandwidth"):
    """algbw and busbw (GB/s) against message size, from allreduce_bench's summary["results"]."""
    ax = _axes((7, 4), "message size (bytes)", "GB/s", title)
    sizes = [r["bytes"] for r in results]
    ax.plot(sizes, [r["algbw_gbps"] for r in results], "o-", label="algbw (bytes / time)")
    ax.plot(sizes, [r["busbw_gbps"] for r in results], "s--", label="busbw (algbw x 2(n-1)/n)")
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    return _finish(ax)


def throughput_by_mode(table, title: str = "throughput by mode"):
    """Bar chart of samples/s, one bar per row of a results table (index = mode name)."""
    ax = _axes((7, 3.5), "", "samples / s", title)
    ax.bar_label(ax.bar(table.index.astype(str), table["samples_per_s"], color="#4c72b0"), fmt="%.0f")
    return _finish(ax)


def scaling_curve(nprocs, samples_per_s, title: str = "DDP scaling"):
    """Measured throughput over 1..N processes, with the ideal N x throughput_1 line."""
    ax = _axes((6, 4), "processes", "samples / s", title)
    ax.plot(nprocs, [n * samples_per_s[0] / nprocs[0] for n in nprocs], "k--", label="ideal (linear)")
    ax.plot(nprocs, samples_per_s, "o-", label="measured")
    ax.set_xticks(list(nprocs))
    return _finish(ax)


def phase_times_per_rank(phases, title: str = "where each rank's step goes"):
    """One stacked bar per rank from `measures.phase_times`: data, the step's own work, the wait for the slowest."""
    ax = _axes((7, 0.6 * len(phases) + 1.8), "median ms per step", "", title)
    labels = [f"rank {int(r)}" for r in phases.index]
    work = phases["train_step_ms"] - phases["wait_ms"]
    left = 0 * work
    for values, label, color in (
        (phases["data_ms"], "data (before any collective)", "#dd8452"),
        (work, "forward + backward + all-reduce + optimizer", "#4c72b0"),
        (phases["wait_ms"], "waiting for the slowest rank", "#c44e52"),
    ):
        ax.barh(labels, values, left=left, label=label, color=color)
        left = left + values
    ax.invert_yaxis()
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.12), ncol=2, fontsize="small", frameon=False)
    ax.figure.tight_layout()
    return ax.figure


def loss_curves(runs, x: str = "samples_seen", title: str = "training loss"):
    """One line per run: `runs` maps a label to a metrics DataFrame (rank 0's rows are used)."""
    ax = _axes((7, 4), x.replace("_", " "), "loss", title)
    for label, metrics in runs.items():
        rows = metrics[metrics["rank"] == 0]
        ax.plot(rows[x], rows["loss"], label=label)
    return _finish(ax)


_NOT_SAMPLED = {
    "CPU": "CPU per rank: not sampled (the run ended before the first sample)",
    "GPU": "GPU utilisation: not sampled\n(no NVML here: pip install nvidia-ml-py; or the run ended first)",
}


def _sampled(resources, column: str):
    """The rows that carry `column` ("rank" for CPU rows, "gpu" for GPU rows), or None if there are none."""
    if column not in resources:
        return None
    rows = resources.dropna(subset=[column])
    return None if rows.empty else rows


def not_sampled(resources, gpus_expected: bool = False) -> list[str]:
    """What the launcher's resource sampler did not record: "CPU", "GPU", both or neither."""
    missing = [] if _sampled(resources, "rank") is not None else ["CPU"]
    if gpus_expected and _sampled(resources, "gpu") is None:
        missing.append("GPU")
    return missing


def resource_usage(resources, title: str = "per-rank CPU use", gpus_expected: bool = False):
    """CPU % per rank over the run, and GPU utilisation per GPU where NVML sampled it."""
    ax = _axes((7, 3.5), "seconds since launch", "%", title)
    cpu, gpu = _sampled(resources, "rank"), _sampled(resources, "gpu")
    for rank, rows in cpu.groupby("rank") if cpu is not None else ():
        ax.plot(rows["elapsed_s"], rows["cpu_percent"], label=f"rank {int(rank)} CPU %")
    for index, rows in gpu.groupby("gpu") if gpu is not None else ():
        ax.plot(rows["elapsed_s"], rows["gpu_util_percent"], "--", label=f"GPU {int(index)} util %")
    missing = not_sampled(resources, gpus_expected)
    if missing:
        text = "\n".join(_NOT_SAMPLED[kind] for kind in missing)
        ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#a33")
    return _finish(ax)
