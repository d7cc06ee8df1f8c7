"""Notebook 08's plan: a global batch every world splits, the checkpoint demo on one device kind."""

from __future__ import annotations

import pytest

from ddp_helpers.kernel.lab.plans import plan_for


def test_two_nodes_of_eight_gpus_get_a_batch_sixteen_ranks_split():
    train = plan_for("08", 8, 8, nodes=2).runs["train"]
    assert train.world == 16 and train.batch is not None and train.batch % 16 == 0, train
    assert train.batch == 32  # the chapter's 24 does not split over 16 ranks; the next multiple does


def test_the_chapter_batch_stays_where_it_splits():
    assert {plan_for("08", 0, n).runs["train"].batch for n in (1, 2, 3)} == {24}


def test_gpu_sizes_differ_from_cpu_sizes_and_smoke_is_tiny():
    assert plan_for("08", 8, 8).sizes != plan_for("08", 0, 2).sizes
    assert plan_for("08", 0, 2, smoke=True).sizes["width"] < plan_for("08", 0, 2).sizes["width"]


def test_save_and_resume_share_a_device_kind_the_resume_can_have():
    for gpus, device in ((0, "cpu"), (2, "cpu"), (4, "cuda")):
        runs = plan_for("08", gpus, 2).runs
        assert runs["save"].device == runs["resume"].device == device, (gpus, runs)
        assert (runs["save"].nproc, runs["resume"].nproc) == (2, 3)


def test_one_rank_still_gets_two_live_ranks_to_shard_over():
    runs = plan_for("08", 0, 1).runs
    assert (runs["train"].nproc, runs["live"].nproc) == (1, 2)


def test_the_worker_refuses_a_batch_its_world_cannot_split_and_takes_the_plans():
    from ddp_helpers.chapters.ch08_beyond_ddp.fsdp import refuse_uneven_batch

    with pytest.raises(SystemExit, match="--global-batch 24 does not split evenly over 16 ranks"):
        refuse_uneven_batch(24, 16)
    train = plan_for("08", 8, 8, nodes=2).runs["train"]
    assert train.batch is not None
    refuse_uneven_batch(train.batch, train.world)  # no exit
