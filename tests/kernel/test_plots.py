"""The figures say what was not sampled instead of drawing an empty plot."""

from __future__ import annotations

import matplotlib
import pandas as pd
import pytest

from ddp_helpers.kernel.lab import plots

matplotlib.use("Agg")

CPU_ROWS = pd.DataFrame(
    [
        {"elapsed_s": 0.5, "rank": 0, "cpu_percent": 90.0, "rss_bytes": 1},
        {"elapsed_s": 0.5, "rank": 1, "cpu_percent": 80.0, "rss_bytes": 1},
    ]
)
GPU_ROWS = pd.DataFrame([{"elapsed_s": 0.5, "gpu": 0, "gpu_util_percent": 70, "gpu_mem_used_bytes": 1}])


def figure_text(fig) -> str:
    return "\n".join(text.get_text() for ax in fig.axes for text in ax.texts)


def legend_labels(fig) -> list[str]:
    return [label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]]


@pytest.mark.parametrize(
    ("resources", "gpus_expected", "missing"),
    [
        (CPU_ROWS, False, []),
        (CPU_ROWS, True, ["GPU"]),
        (pd.concat([CPU_ROWS, GPU_ROWS]), True, []),
        (pd.DataFrame(), False, ["CPU"]),
        (pd.DataFrame(), True, ["CPU", "GPU"]),
    ],
)
def test_not_sampled_names_what_is_missing(resources, gpus_expected, missing):
    assert plots.not_sampled(resources, gpus_expected=gpus_expected) == missing


def test_missing_gpu_samples_are_written_on_the_figure():
    fig = plots.resource_usage(CPU_ROWS, gpus_expected=True)
    assert "GPU utilisation: not sampled" in figure_text(fig)
    assert legend_labels(fig) == ["rank 0 CPU %", "rank 1 CPU %"]


def test_an_empty_sample_is_said_not_drawn():
    fig = plots.resource_usage(pd.DataFrame(), gpus_expected=True)
    assert "CPU per rank: not sampled" in figure_text(fig)
    assert "GPU utilisation: not sampled" in figure_text(fig)
    assert legend_labels(fig) == []


def test_full_samples_draw_every_series_and_no_note():
    fig = plots.resource_usage(pd.concat([CPU_ROWS, GPU_ROWS]), gpus_expected=True)
    assert figure_text(fig) == ""
    assert legend_labels(fig) == ["rank 0 CPU %", "rank 1 CPU %", "GPU 0 util %"]
