"""Notebook 08's plan: a global batch every world splits, live ranks to shard over, and the checkpoint demo
(save on 2 ranks, resume on 3) on the one device kind the resume can have."""

from __future__ import annotations

import pytest
from plan_rules import KINDS, at_least_two, every_shape, placed, sizes_by_kind, visible_to

from ddp_helpers.chapters.ch08_beyond_ddp.ch08_plan import CHAPTER_BATCH
from ddp_helpers.chapters.ch08_beyond_ddp.fsdp import refuse_uneven_batch
from ddp_helpers.kernel.lab.plan_core import NotebookPlan, placement_line


def test_the_job_runs_the_chapters_batch_where_its_world_splits_it_else_the_next_multiple_of_the_world():
    def rule(plan: NotebookPlan) -> None:
        m, train = plan.machine, plan.runs["train"]
        placed(m, train, m.nproc, nodes=m.nodes)
        assert train.batch is not None and train.batch % train.world == 0, train
        assert CHAPTER_BATCH <= train.batch < CHAPTER_BATCH + train.world, train  # the least that splits
        refuse_uneven_batch(train.batch, train.world)  # the worker takes it (it exits on one it refuses)

    every_shape("08", rule)


def test_the_worker_refuses_a_batch_its_world_cannot_split():
    with pytest.raises(SystemExit, match="--global-batch 24 does not split evenly over 16 ranks"):
        refuse_uneven_batch(24, 16)


def test_the_live_ranks_are_two_at_least_and_the_line_says_where_they_run_where_the_job_runs_elsewhere():
    """One rank has nothing to shard."""

    def rule(plan: NotebookPlan) -> None:
        live, train = plan.runs["live"], plan.runs["train"]
        placed(plan.machine, live, at_least_two(plan.machine))
        said = f"The live ranks: {placement_line(plan.machine, live)}" in plan.line
        assert said == (live != train), plan.line

    every_shape("08", rule)


def test_the_checkpoint_demo_saves_on_two_and_resumes_on_three_on_the_kind_the_resume_can_have():
    """The resumed loss follows the saved run, so save, resume and the 1-rank DDP checkpoint share the resume's
    device kind: GPUs where each of its three ranks has one."""

    def rule(plan: NotebookPlan) -> None:
        m, train = plan.machine, plan.runs["train"]
        kind = "cuda" if m.gpus >= 3 else "cpu"
        for name, ranks in (("save", 2), ("resume", 3), ("ddp-checkpoint", 1)):
            run = plan.runs[name]
            assert (run.nproc, run.nodes, run.device) == (ranks, 1, kind), (name, run)
            assert kind == "cuda" or visible_to(run, m.gpus) == 0, (name, run)  # on the CPU, the GPUs hidden
        assert plan.runs["save"].batch == plan.runs["resume"].batch == CHAPTER_BATCH
        assert (("save", "resume") in plan.compared) == (kind == train.device), plan.compared
        said = "The checkpoint demo (save on 2, resume on 3) runs on one node" in plan.line
        assert said == (kind != train.device or m.nodes > 1), plan.line

    every_shape("08", rule)


def test_gpus_get_wider_work_and_smoke_mode_a_smaller_model_and_fewer_steps():
    sizes = sizes_by_kind("08")
    assert sizes["cuda", False]["width"] >= sizes["cpu", False]["width"], sizes
    assert sizes["cuda", False] != sizes["cpu", False], sizes
    for kind in KINDS:
        full, smoke = sizes[kind, False], sizes[kind, True]
        assert smoke["width"] < full["width"], (kind, sizes)
        assert all(smoke[k] <= full[k] for k in ("depth", "steps")), (kind, sizes)
