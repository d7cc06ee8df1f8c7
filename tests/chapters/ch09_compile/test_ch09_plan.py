"""Notebook 09's plan (live ranks two at least, each rank's batch the same on every world) and its cold
compile cache."""

from __future__ import annotations

import inspect
import os

from plan_rules import KINDS, at_least_two, every_shape, placed, says_why_it_runs_more, sizes_by_kind

from ddp_helpers.chapters.ch09_compile import compile_ddp
from ddp_helpers.chapters.ch09_compile.ch09_plan import fresh_cache_env
from ddp_helpers.kernel.lab.plan_core import NotebookPlan

PER_RANK_BATCH = inspect.signature(compile_ddp.batch).parameters["size"].default  # each rank's, in every run


def test_the_live_ranks_are_two_at_least_and_their_global_batch_is_each_ranks_batch_times_the_world():
    """Every section compares ranks with each other: one rank has no other to differ from."""

    def rule(plan: NotebookPlan) -> None:
        for name in ("live", "exercises"):
            placed(plan.machine, plan.runs[name], at_least_two(plan.machine))
        live = plan.runs["live"]
        assert live.batch == PER_RANK_BATCH * live.world, live
        says_why_it_runs_more(plan, live)

    every_shape("09", rule)


def test_the_model_is_the_same_everywhere_one_layer_per_piece_at_the_smallest_bucket_cap():
    """512 x 512 floats: 1 MiB of gradient per layer, so the smallest cap splits the graph once per layer."""
    sizes = sizes_by_kind("09")
    models = {(s["width"], s["depth"]) for s in sizes.values()}
    assert len(models) == 1, sizes  # the same model on every kind, smoke or not
    for kind in KINDS:
        full, smoke = sizes[kind, False], sizes[kind, True]
        for s in (full, smoke):
            caps = [float(cap) for cap in s["bucket_caps"].split(",")]
            assert len(caps) >= 2, s  # a sweep: two caps at least
            assert min(caps) == s["width"] ** 2 * 4 / 2**20, s  # one layer's gradient, in MiB
        assert smoke["steps"] < full["steps"], (kind, sizes)


def test_each_run_gets_an_empty_inductor_cache_that_torch_uses(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    first, second = fresh_cache_env(tmp_path), fresh_cache_env(tmp_path)
    assert first != second and not os.listdir(first["TORCHINDUCTOR_CACHE_DIR"])
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", first["TORCHINDUCTOR_CACHE_DIR"])
    assert cache_dir() == first["TORCHINDUCTOR_CACHE_DIR"]  # inductor writes its caches there
