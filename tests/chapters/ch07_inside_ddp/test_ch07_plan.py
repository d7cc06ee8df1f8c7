"""Notebook 07's plan: every demo on two ranks at least; sizes by device kind, a model whose gradients fill
more than one of DDP's buckets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plan_rules import KINDS, at_least_two, every_shape, heavier, placed, says_why_it_runs_more, sizes_by_kind

from ddp_helpers.chapters.ch07_inside_ddp.ch07_plan import LENGTHS, SMOKE_BUCKET_CAP_MB
from ddp_helpers.kernel.lab.plan_core import NotebookPlan

DDP_BUCKET_CAP_MB = 25  # DDP's default bucket_cap_mb (torch 2.7.1 and 2.14.1)


def layer_mib(sizes: Mapping[str, Any]) -> float:
    """One of the MLP's width x width layers' fp32 gradients, in MiB."""
    return sizes["width"] ** 2 * 4 / 2**20


def test_every_demo_runs_the_ranks_asked_for_or_two_and_the_line_says_why():
    """An all-reduce over one rank has nothing to average."""

    def rule(plan: NotebookPlan) -> None:
        for name in ("demo", "exercise"):
            placed(plan.machine, plan.runs[name], at_least_two(plan.machine))
        says_why_it_runs_more(plan, plan.runs["demo"])

    every_shape("07", rule)


def test_the_cpu_runs_a_deep_mlp_and_gpus_a_heavier_model_on_larger_images():
    sizes = sizes_by_kind("07")
    for smoke in (False, True):
        cpu = sizes["cpu", smoke]
        assert cpu["model"] == "mlp" and cpu["depth"] > 1, cpu  # layers that fill DDP's buckets
    cpu, gpu = sizes["cpu", False], sizes["cuda", False]
    assert heavier(gpu["model"], than=cpu["model"]) and gpu["image_size"] > cpu["image_size"], (cpu, gpu)


def test_the_mlps_gradients_fill_several_buckets_and_smoke_mode_has_a_smaller_mlp_and_shorter_runs():
    """Full size: DDP's default bucket holds a few layers, fewer than the model's; smoke: one layer fills
    SMOKE_BUCKET_CAP_MB, so a small model still has a bucket per layer."""
    sizes = sizes_by_kind("07")
    full = sizes["cpu", False]
    assert 1 < DDP_BUCKET_CAP_MB / layer_mib(full) < full["depth"], full
    for kind in KINDS:
        smoke = sizes[kind, True]
        assert smoke["model"] == "mlp" and smoke["depth"] > 1, smoke
        assert layer_mib(smoke) <= SMOKE_BUCKET_CAP_MB, smoke
        assert smoke["width"] < sizes[kind, False]["width"], (kind, sizes)
        assert smoke["batch_size"] <= sizes[kind, False]["batch_size"], (kind, sizes)
    for key in ("steps", "accumulate", "profile_steps"):
        assert LENGTHS[True][key] < LENGTHS[False][key], key
    assert all(0 < lengths["warmup_steps"] < lengths["steps"] for lengths in LENGTHS.values()), LENGTHS
