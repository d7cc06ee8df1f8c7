"""Notebook 03's plan: the speed runs' sizes by device kind, and the overflow demo's second rank."""

from __future__ import annotations

from ddp_helpers.lab.plans import plan_for

CPU = {"model": "mlp", "image_size": 32, "batch_size": 64, "memory_batch": 64}  # CI's sizes


def test_the_cpu_keeps_its_sizes():
    for smoke in (False, True):
        assert dict(plan_for("03", 0, 2, smoke=smoke).sizes) == CPU
        assert dict(plan_for("03", 1, 2, smoke=smoke).sizes) == CPU  # fewer GPUs than ranks: the CPU


def test_gpus_get_resnet50_at_224_px_and_the_kernel_counts_a_few_images():
    sizes = plan_for("03", 4, 4).sizes
    assert (sizes["model"], sizes["image_size"]) == ("resnet50", 224), sizes
    assert sizes["batch_size"] > CPU["batch_size"] and sizes["memory_batch"] < sizes["batch_size"], sizes


def test_one_rank_runs_the_overflow_demo_on_two_and_says_where():
    plan = plan_for("03", 1, 1)
    assert (plan.runs["speed"].device, plan.runs["speed"].nproc) == ("cuda", 1)
    demo = plan.runs["overflow"]
    assert (demo.nproc, demo.device, demo.backend, demo.env) == (
        2,
        "cpu",
        "gloo",
        {"CUDA_VISIBLE_DEVICES": ""},
    )
    assert "need two ranks" in plan.line and "2 gloo ranks on the CPU" in plan.line, plan.line
    assert plan_for("03", 2, 1).runs["overflow"].device == "cuda"  # two GPUs: nccl
