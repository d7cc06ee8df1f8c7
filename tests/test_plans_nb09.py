"""Notebook 09's plan (two ranks at least, a global batch per world) and its cold compile cache."""

from __future__ import annotations

import os

from ddp_helpers.chapters.ch09_compile.ch09_compile_cache import fresh_cache_env
from ddp_helpers.kernel.lab.plans import plan_for


def test_one_rank_asked_still_runs_two_and_the_global_batch_grows_with_the_world():
    one = plan_for("09", 0, 1)
    assert one.runs["live"].nproc == 2 and one.line.startswith("nproc = 1, but these demos compare ranks")
    sixteen = plan_for("09", 8, 8, nodes=2).runs["live"]
    assert (sixteen.device, sixteen.nproc, sixteen.batch) == ("cuda", 8, 16 * 8)


def test_one_gpu_runs_the_two_live_ranks_on_gloo_with_the_gpu_hidden():
    live = plan_for("09", 1, 1).runs["live"]
    assert (live.device, live.backend, live.env) == ("cpu", "gloo", {"CUDA_VISIBLE_DEVICES": ""})


def test_each_run_gets_an_empty_inductor_cache_that_torch_uses(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    first, second = fresh_cache_env(tmp_path), fresh_cache_env(tmp_path)
    assert first != second and not os.listdir(first["TORCHINDUCTOR_CACHE_DIR"])
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", first["TORCHINDUCTOR_CACHE_DIR"])
    assert cache_dir() == first["TORCHINDUCTOR_CACHE_DIR"]  # inductor writes its caches there


def test_smoke_mode_shortens_the_runs_but_keeps_the_model():
    full, smoke = plan_for("09", 0, 2).sizes, plan_for("09", 0, 2, smoke=True).sizes
    assert (full["width"], full["depth"]) == (smoke["width"], smoke["depth"]) == (512, 4)
    assert smoke["steps"] < full["steps"] and len(smoke["bucket_caps"].split(",")) >= 2
