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
