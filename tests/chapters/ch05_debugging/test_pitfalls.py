"""The pitfalls worker (notebook 05) where the notebook does not go.

Each test starts a real torchrun job on gloo. The notebook itself checks every case with its default
world in `make test`, and with an odd world (nproc=3) in `make test-compat`: the monitored barrier's
blame, BatchNorm's local statistics and Join's 1/world scaling are asserted there. These cover one
rank, a save that fits its timeout, and what needs a GPU.
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
