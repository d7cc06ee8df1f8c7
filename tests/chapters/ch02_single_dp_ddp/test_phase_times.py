"""Notebook 02's analysis helpers: per-rank phase times, the straggler, per-device efficiency and the
process scan. (train.py's real timings and its TensorBoard scalars: test_train_worker.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from types import SimpleNamespace

import matplotlib
import pandas as pd
import pytest

from ddp_helpers.kernel.lab import measures, plots
from ddp_helpers.kernel.launcher.processes import processes_marked

matplotlib.use("Agg")


def phase_rows(data_ms: dict[int, float], work_ms: float = 10.0, steps: int = 4) -> pd.DataFrame:
    """Metrics of a synchronous step: every rank finishes when the slowest one does."""
    slowest = max(data_ms.values())
    rows = [
        {"rank": r, "step": s, "data_time_s": d / 1e3, "train_step_time_s": (slowest - d + work_ms) / 1e3}
        for s in range(1, steps + 1)
        for r, d in data_ms.items()
    ]
    return pd.DataFrame(rows)


def test_phase_times_split_own_time_from_waiting():
    phases = measures.phase_times(phase_rows({0: 1.0, 1: 41.0, 2: 1.0}))
    assert phases["data_ms"].round(6).tolist() == [1.0, 41.0, 1.0]
    assert phases["wait_ms"].round(6).tolist() == [40.0, 0.0, 40.0]
    assert phases["whole_step_ms"].round(6).tolist() == [51.0, 51.0, 51.0]
    assert measures.straggler(phases) == 1


def test_phase_times_skip_warmup_and_untimed_steps():
    rows = phase_rows({0: 1.0, 1: 5.0})
    rows.loc[rows["step"] == 1, "data_time_s"] = 9.0  # a slow first step, to be skipped
    rows.loc[rows["step"] == 3, ["data_time_s", "train_step_time_s"]] = None  # not timed
    phases = measures.phase_times(rows, skip_steps=1)
    assert phases.loc[0, "data_ms"] == pytest.approx(1.0)


def test_no_straggler_with_one_rank_or_when_the_signs_disagree():
    assert measures.straggler(measures.phase_times(phase_rows({0: 3.0}))) is None
    disagree = pd.DataFrame({"data_ms": [5.0, 1.0], "wait_ms": [3.0, 0.0]}, index=[0, 1])
    assert measures.straggler(disagree) is None


def test_phase_times_refuse_metrics_without_them():
    with pytest.raises(ValueError, match="no phase timings"):
        measures.phase_times(pd.DataFrame({"rank": [0], "step": [1], "loss": [1.0]}))
    with pytest.raises(ValueError, match="no timed step after step 9"):
        measures.phase_times(phase_rows({0: 1.0, 1: 2.0}), skip_steps=9)


def run(samples_per_s, world_size, devices=None, peaks=None):
    summary = {
        "samples_per_s": samples_per_s,
        "world_size": world_size,
        "peak_mem_bytes": 2**20,
        "peak_mem_kind": "cuda_max_memory_allocated",
        "devices": devices,
        "peak_mem_bytes_per_device": peaks,
    }
    return SimpleNamespace(summary=summary, metrics=pd.DataFrame())


def test_efficiency_is_per_device_for_dataparallel_too():
    runs = {
        "single": run(100.0, 1, devices=1),
        "dp": run(250.0, 1, devices=4, peaks=[4 * 2**20, 2**20, 2**20, 2**20]),
        "ddp": run(380.0, 4),  # an older summary without "devices": the world size counts
    }
    table = measures.results_table(runs, baseline="single")
    assert table.loc["dp", "scaling_efficiency"] == pytest.approx(0.625)  # not 2.5: 4 GPUs did it
    assert table.loc["ddp", "scaling_efficiency"] == pytest.approx(0.95)
    assert table.loc["dp", "samples_per_s_per_device"] == pytest.approx(62.5)
    assert table.loc["dp", "peak_mem_MiB"] == pytest.approx(4.0)  # the busiest GPU, GPU 0


def test_phase_plot_draws_three_parts_per_rank():
    fig = plots.phase_times_per_rank(measures.phase_times(phase_rows({0: 1.0, 1: 41.0})))
    ax = fig.axes[0]
    assert len(ax.patches) == 3 * 2
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]


def test_process_scan_finds_a_marked_child_and_not_after_it_ends():
    marker = uuid.uuid4().hex
    env = {**os.environ, "SCAN_TEST": marker}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        assert processes_marked("SCAN_TEST", marker) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert processes_marked("SCAN_TEST", marker) == []


def test_whole_step_is_a_mean_so_per_step_offsets_cancel():
    # rank 0 ends one step late and the next early: per step the ranks differ, over the run they do not
    rows = pd.DataFrame(
        [
            {"rank": 0, "step": s, "data_time_s": 0.0, "train_step_time_s": t}
            for s, t in ((1, 0.01), (2, 0.01), (3, 0.04))
        ]
        + [{"rank": 1, "step": s, "data_time_s": 0.0, "train_step_time_s": 0.02} for s in (1, 2, 3)]
    )
    whole = measures.phase_times(rows)["whole_step_ms"]
    assert whole[0] == pytest.approx(whole[1]) == pytest.approx(20.0)
