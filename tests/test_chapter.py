"""Every chapter's setup: the ranks its launches use, and the backend for a demo of N ranks."""

from __future__ import annotations

import pytest

from ddp_helpers.lab.chapter import Chapter, chapter_setup
from ddp_helpers.launcher.machine import visible_gpus


def test_the_parameter_wins_else_one_rank_per_gpu_else_two():
    assert chapter_setup(3).nproc == 3
    gpus = visible_gpus()
    assert chapter_setup(None) == Chapter(gpus=gpus, nproc=gpus or 2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_a_bad_nproc_is_refused_with_what_was_given(bad):
    with pytest.raises(ValueError, match=repr(bad).replace(".", r"\.")):
        chapter_setup(bad)


def test_a_demo_needing_more_ranks_than_gpus_runs_on_gloo_and_says_so():
    one_gpu = Chapter(gpus=1, nproc=1)
    backend, line = one_gpu.backend_for(2)
    assert backend == "gloo" and "2 gloo ranks" in line
    assert Chapter(gpus=8, nproc=8).backend_for(2)[0] == "auto"  # nccl: a GPU per rank
    assert Chapter(gpus=0, nproc=2).backend_for(2) == (
        "auto",
        "2 rank(s) on the CPU with gloo (no GPU here).",
    )
