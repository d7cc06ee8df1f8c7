"""Notebook 05's helpers (ddp_helpers/chapters/ch05_debugging/ch05_pitfall_runs.py): a pitfall that must fail is launched and its
error returned, with the worker's own frames or each rank's waiting line; one that ends well fails.

Real torchrun jobs of the pitfalls worker, on gloo with 2 ranks. The notebook runs the rest (the
mismatch, the live ranks) in `make test`, and its mutants check that each of its checks can fail.
"""

from __future__ import annotations

import pytest

from ddp_helpers import LaunchTimeout, WorkerFailed
from ddp_helpers.chapters.ch05_debugging.ch05_pitfall_runs import (
    PitfallRuns,
    line_of_the_worker,
    printed,
    worker_frames,
)
from ddp_helpers.workers import worker_path


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DDP_HELPERS_RUNS_DIR", str(tmp_path / "runs"))  # each launch's run dir
    return PitfallRuns(worker_path("pitfalls"), world=2, backend="gloo", failure_timeout=120)


def test_a_crash_is_returned_with_the_line_that_raised(runs, capsys):
    crashed = runs.expect_failure("crash", lines=2)
    assert isinstance(crashed, WorkerFailed) and crashed.rank == 1, crashed
    frames = worker_frames(crashed.traceback)
    assert frames[-1][0] == "crash" and frames[-1][1].startswith("raise ZeroDivisionError"), frames
    assert capsys.readouterr().out.startswith("WorkerFailed: "), "the head of the error is printed"


def test_a_hang_is_returned_with_where_each_rank_waits(runs):
    hung = runs.expect_failure("hang", expected=LaunchTimeout, timeout=5)
    assert runs.started(hung.run_dir)  # every rank printed its line before it waited
    assert any(line.startswith("rank 1: skipping") for line in printed(hung.run_dir, 1))
    assert line_of_the_worker(hung.stacks[1]).startswith("time.sleep(3600)"), hung.stacks[1]
    assert line_of_the_worker(hung.stacks[0]) == "dist.all_reduce(x)", hung.stacks[0]


def test_a_pitfall_that_ends_well_fails_the_check(runs):
    with pytest.raises(AssertionError, match="'crash' pitfall ran to the end"):
        runs.expect_failure("crash", "--fix")
