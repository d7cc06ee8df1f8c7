"""Exact resume and elastic restart with the training worker: 2 gloo ranks, --deterministic."""

from __future__ import annotations

import shutil

import pytest
import torch

from ddp_helpers import launch, read_metrics
from ddp_helpers.checkpoint import checkpoint_path
from ddp_helpers.workers import worker_path

TRAIN = worker_path("train")
# 512 samples / (2 ranks x 32) = 8 steps per epoch; dropout and a cosine schedule make RNG and
# scheduler state matter, momentum makes optimizer state matter
RUN = [
    "--num-samples",
    512,
    "--batch-size",
    32,
    "--steps",
    12,
    "--hidden",
    32,
    "--deterministic",
    "--dropout",
    0.2,
    "--lr-schedule",
    "cosine",
    "--log-every",
    1,
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One run to the end, checkpointing every 4 steps: at 4 (mid-epoch), 8 (epoch end) and 12."""
    root = tmp_path_factory.mktemp("full")
    launch(
        TRAIN,
        *RUN,
        "--checkpoint-dir",
        root / "ckpt",
        "--save-every",
        4,
        "--keep-checkpoints",
        10,
        "--save-final",
        root / "final.pt",
        nproc=2,
        run_dir=root / "run",
        progress="off",
    )
    return root


def resume_from(uninterrupted, step, tmp_path, *extra):
    # a checkpoint directory holding only the checkpoint of `step`, as if the run had stopped there
    (tmp_path / "ckpt").mkdir()
    shutil.copy(checkpoint_path(uninterrupted / "ckpt", step), tmp_path / "ckpt")
    return launch(
        TRAIN,
        *RUN,
        "--checkpoint-dir",
        tmp_path / "ckpt",
        "--resume",
        *extra,
        "--save-final",
        tmp_path / "final.pt",
        nproc=2,
        run_dir=tmp_path / "run",
    )


def assert_same_weights(a, b):
    a, b = torch.load(a), torch.load(b)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ"


@pytest.mark.parametrize("step", [4, 8], ids=["mid-epoch", "epoch-boundary"])
def test_resume_is_bitwise_exact(uninterrupted, tmp_path, step):
    resumed = resume_from(uninterrupted, step, tmp_path)
    assert_same_weights(uninterrupted / "final.pt", tmp_path / "final.pt")
    full = read_metrics(uninterrupted / "run")
    full = full[full.step > step][["rank", "step", "loss"]].reset_index(drop=True)
    again = resumed.metrics[["rank", "step", "loss"]].reset_index(drop=True)
    assert full.equals(again), "the loss curves after the resume differ"


def test_ranks_draw_their_own_dropout_masks_from_seed_plus_rank(uninterrupted):
    """The model starts from the same seed everywhere, but each rank's generator runs from seed + rank."""
    saved = torch.load(checkpoint_path(uninterrupted / "ckpt", 4), weights_only=True)
    rank0, rank1 = saved["rng"]
    assert not torch.equal(rank0["torch"], rank1["torch"]), "both ranks drew the same random numbers"


# --resume-ignore (each name drops its own state: the weights drift, the lr schedule goes on unless the
# scheduler is dropped): notebook 04 runs it for optimizer, scheduler and rng and asserts both.


def test_elastic_restart_resumes_and_matches_the_uninterrupted_run(uninterrupted, tmp_path):
    result = launch(
        TRAIN,
        *RUN,
        "--checkpoint-dir",
        tmp_path / "ckpt",
        "--save-every",
        4,
        "--resume",
        "--fail-at-step",
        6,
        "--fail-rank",
        1,
        "--save-final",
        tmp_path / "final.pt",
        nproc=2,
        max_restarts=1,
        run_dir=tmp_path / "run",
        show_ranks="none",
    )
    assert result.returncode == 0 and result.attempts == 2
    # steps 5 and 6 ran twice (before the fault, and again after resuming at 4): the rerun is kept
    assert result.metrics.groupby("rank")["step"].apply(list).tolist() == [list(range(1, 13))] * 2
    assert set(result.metrics.loc[result.metrics.step.between(5, 6), "attempt"]) == {1}
    assert "resumed from ckpt-step00000004.pt" in result.log(0)
    assert_same_weights(uninterrupted / "final.pt", tmp_path / "final.pt")
    first_error = next((tmp_path / "run" / "logs").glob("*/attempt_0/1/error.json")).read_text()
    assert "injected fault on rank 1 at step 6" in first_error
