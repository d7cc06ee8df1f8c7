"""The pitfalls worker (notebook 05) on shapes the notebook's default run does not cover.

Each test starts a real torchrun job on gloo. The notebook itself checks every case with its
default world; these cover one rank, an odd world, and what needs a GPU.
"""

from __future__ import annotations

import pytest

from ddp_helpers import WorkerFailed, launch
from ddp_helpers.workers import worker_path


def run(case, *extra, nproc, tmp_path, **options):
    return launch(
        worker_path("pitfalls"),
        "--case",
        case,
        *extra,
        nproc=nproc,
        backend="gloo",
        run_dir=tmp_path / "run",
        show_ranks="none",
        progress="off",
        timeout=120,
        **options,
    )


def test_a_case_refuses_a_world_of_one_and_says_why(tmp_path):
    with pytest.raises(WorkerFailed) as info:
        run("hang", nproc=1, tmp_path=tmp_path)
    assert "needs two ranks" in str(info.value)


def test_monitored_barrier_blames_rank_1_in_an_odd_world(tmp_path):
    # rank 2 waits at the barrier too: its own, longer timeout must not beat rank 0's report
    with pytest.raises(WorkerFailed) as info:
        run("monitored_barrier", nproc=3, tmp_path=tmp_path)
    assert info.value.rank == 0
    assert "Rank 1" in info.value.error and "monitoredBarrier" in info.value.error


def test_batchnorm_normalises_locally_and_keeps_rank_0_statistics(tmp_path):
    ranks = run("batchnorm", nproc=3, tmp_path=tmp_path).summary["ranks"]

    def gap(a, b):
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    assert [round(r["input_mean"] / 10) for r in ranks] == [0, 1, 2]  # skewed shards
    assert all(gap(r["output_mean"], [0.0] * 4) < 1e-4 for r in ranks)  # each rank's own batch
    assert all(r["running_mean_at_forward"] == ranks[0]["running_mean_at_forward"] for r in ranks)
    assert gap(ranks[0]["running_mean"], ranks[0]["own_data_running_mean"]) < 1e-5
    assert gap(ranks[0]["running_mean"], ranks[0]["global_data_running_mean"]) > 1
    # the other ranks updated the broadcast statistics once with their own batch: they differ
    assert all(gap(r["running_mean"], ranks[0]["running_mean"]) > 0.1 for r in ranks[1:])


@pytest.mark.gpu
def test_the_oom_case_reports_the_error_in_a_worker(tmp_path):
    result = launch(
        worker_path("pitfalls"),
        "--case",
        "oom",
        nproc=1,
        run_dir=tmp_path / "run",
        show_ranks="none",
        progress="off",
        timeout=120,
    )
    oom = result.summary["ranks"][0]
    assert "out of memory" in oom["error"].lower()
    assert oom["allocated"] >= oom["kept"]


def test_slow_save_passes_with_a_timeout_longer_than_the_save(tmp_path):
    result = run("slow_save", "--save-seconds", 2, "--pg-timeout", 30, nproc=2, tmp_path=tmp_path)
    assert all(f"rank {rank}: past the barrier" in result.logs[rank] for rank in range(2))


def test_join_scales_late_gradients_by_the_initial_world_size_in_an_odd_world(tmp_path):
    rank0 = run("uneven", "--fix", nproc=3, tmp_path=tmp_path).summary["ranks"][0]
    counts = rank0["all_reduces_per_step"]
    # one bucket's all-reduce; inside Join also Join's count and DDP's sync agreement. Counted as
    # issued: gloo's own ranges can end after the profiler stops (CI once counted 0 without Join)
    assert counts == {"without Join": 1, "inside Join": 3}, counts
    assert all(abs(ratio - 1 / 3) < 1e-6 for ratio in rank0["grad_over_local"][4:])  # alone: 1/3
