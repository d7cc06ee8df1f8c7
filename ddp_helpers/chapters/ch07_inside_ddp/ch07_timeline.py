"""Compute and all-reduce on one time axis: read torch.profiler's Chrome traces, measure the overlap, draw it.

Hidden all-reduce time counts only what ran during compute in the backward call that started it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

Interval = tuple[float, float]  # (start, end) in milliseconds from the first profiled step

PHASES = ("forward", "backward", "optimizer")  # the record_function ranges the workers set
_COMM = re.compile(r"^gloo:all_?reduce|nccl", re.IGNORECASE)
_NOT_COMPUTE = re.compile(r"c10d::|reducer|distributed|gloo|nccl|record_param_comms", re.IGNORECASE)


@dataclass
class Timeline:
    """One rank's profiled steps, as merged intervals in milliseconds."""

    rank: int
    device: str  # "cpu" or "cuda": where compute and all-reduce were measured
    steps: list[Interval] = field(default_factory=list)
    phases: dict[str, list[Interval]] = field(default_factory=dict)
    compute: list[Interval] = field(default_factory=list)
    allreduce: list[Interval] = field(default_factory=list)
    allreduce_in_backward: list[Interval] = field(default_factory=list)  # clipped to its own backward

    @property
    def overlap(self) -> list[Interval]:
        return intersect(self.compute, self.allreduce)

    @property
    def hidden_ms(self) -> float:
        """Milliseconds of all-reduce that ran during compute in the backward call that started it."""
        return total(intersect(self.compute, self.allreduce_in_backward))

    @property
    def overlap_fraction(self) -> float:
        """The share of all-reduce time during which compute ran too (0 when nothing was reduced)."""
        comm = total(self.allreduce)
        return total(self.overlap) / comm if comm else 0.0


# ---------------------------------------------------------------------------- interval maths


def union(intervals: list[Interval]) -> list[Interval]:
    """The same time, as sorted intervals that do not overlap."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The time covered by both `a` and `b` (each merged first)."""
    a, b = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The time in `a` that is not in `b`."""
    out = []
    for start, end in union(a):
        for cut_start, cut_end in union(b):
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                out.append((start, cut_start))
            start = max(start, cut_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def total(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in union(intervals))


def clip_to_containing(spans: list[Interval], windows: list[Interval]) -> list[Interval]:
    """Each span cut at the end of the window its start lies in; spans starting in no window dropped."""
    out = []
    for start, end in spans:
        for w_start, w_end in windows:
            if w_start <= start < w_end:
                out.append((start, min(end, w_end)))
                break
    return out


# ---------------------------------------------------------------------------- reading a trace


def read_trace(path: str | os.PathLike[str]) -> Timeline:
    """Read one rank's Chrome trace (``prof.export_chrome_trace``) into a `Timeline`."""
    trace = json.loads(Path(path).read_text())
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    rank = trace.get("distributedInfo", {}).get("rank")
    rank = int(re.sub(r"\D", "", Path(path).stem) or 0) if rank is None else int(rank)
    steps = [e for e in events if re.fullmatch(r"step \d+", e["name"])]
    origin = min(e["ts"] for e in (steps or events)) if events else 0.0

    def span(e: dict) -> Interval:
        return ((e["ts"] - origin) / 1e3, (e["ts"] + e["dur"] - origin) / 1e3)

    kernels = [e for e in events if e.get("cat") == "kernel"]
    on_gpu = bool(kernels)
    comm = [span(e) for e in (kernels if on_gpu else events) if _COMM.search(e["name"])]
    if on_gpu:
        compute = [span(e) for e in kernels if not _COMM.search(e["name"])]
    else:
        thread = steps[0]["tid"] if steps else None  # the training thread
        ops = [e for e in events if e.get("cat") == "cpu_op" and (thread is None or e["tid"] == thread)]
        busy = [span(e) for e in ops if not _NOT_COMPUTE.search(e["name"])]
        bookkeeping = [span(e) for e in ops if _NOT_COMPUTE.search(e["name"])]
        compute = subtract(busy, bookkeeping)
    # record_function ranges appear on the GPU's time line too: there they line up with the kernels
    annotations = [
        e for e in events if e.get("cat") == ("gpu_user_annotation" if on_gpu else "user_annotation")
    ]
    annotations = annotations or events
    backward = [span(e) for e in annotations if e["name"] == "backward"]
    return Timeline(
        rank=rank,
        device="cuda" if on_gpu else "cpu",
        steps=union([span(e) for e in steps]),
        phases={name: union([span(e) for e in annotations if e["name"] == name]) for name in PHASES},
        compute=union(compute),
        allreduce=union(comm),
        allreduce_in_backward=union(clip_to_containing(comm, backward)),
    )


def read_traces(directory: str | os.PathLike[str]) -> list[Timeline]:
    """Every ``rank*.json`` trace in `directory`, by rank."""
    paths = sorted(Path(directory).glob("rank*.json"))
    if not paths:
        raise FileNotFoundError(f"no rank*.json traces in {directory}")
    return sorted((read_trace(path) for path in paths), key=lambda timeline: timeline.rank)


def overlap_table(timelines: list[Timeline]) -> pd.DataFrame:
    """Per rank: milliseconds of compute, all-reduce, both at once, and all-reduce alone."""
    import pandas as pd

    rows = []
    for t in timelines:
        rows.append(
            {
                "rank": t.rank,
                "profiled_ms": total(t.steps),
                "backward_ms": total(t.phases.get("backward", [])),
                "compute_ms": total(t.compute),
                "allreduce_ms": total(t.allreduce),
                "overlapped_ms": total(t.overlap),
                "hidden_in_backward_ms": t.hidden_ms,
                "exposed_allreduce_ms": total(subtract(t.allreduce, t.compute)),
                "overlap_fraction": t.overlap_fraction,
            }
        )
    return pd.DataFrame(rows).set_index("rank")


# ---------------------------------------------------------------------------- drawing


_ROWS = (("phase", 2.0), ("compute", 1.0), ("all-reduce", 0.0))
_PHASE_COLOURS = {"forward": "#9ecae1", "backward": "#3182bd", "optimizer": "#bdbdbd"}


def plot_timelines(timelines: list[Timeline], title: str = "") -> Figure:
    """One panel per rank (the first four) on a shared time axis: phases, compute, all-reduces."""
    import matplotlib.pyplot as plt

    shown = timelines[:4]
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 1.6 * len(shown) + 0.8), sharex=True, squeeze=False)
    for ax, t in zip(axes[:, 0], shown, strict=True):
        bars = [(t.phases.get(name, []), 2.1, colour, name) for name, colour in _PHASE_COLOURS.items()]
        bars += [(t.compute, 1.1, "#31a354", "compute"), (t.allreduce, 0.1, "#e6550d", "all-reduce")]
        for spans, y, colour, label in bars:
            ax.broken_barh([(s, e - s) for s, e in spans], (y, 0.8), color=colour, label=label)
        ax.broken_barh(
            [(s, e - s) for s, e in t.overlap],
            (0.1, 0.8),
            facecolor="none",
            edgecolor="black",
            hatch="///",
            linewidth=0,
            label="all-reduce during compute",
        )
        ax.set_yticks([y + 0.5 for _, y in _ROWS], [name for name, _ in _ROWS])
        ax.set_ylim(0, 3)
        ax.set_title(
            f"rank {t.rank} ({t.device}): {t.overlap_fraction:.0%} of all-reduce time overlaps compute",
            fontsize=9,
            loc="left",
        )
    axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    axes[-1, 0].set_xlabel("milliseconds from the first profiled step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
