"""Notebook 07's plan: two ranks at least, and the sizes CI has always run on the CPU."""

from __future__ import annotations

from ddp_helpers.kernel.lab.plans import plan_for


def test_one_rank_asked_still_runs_two_and_says_why():
    plan = plan_for("07", 1, 1)
    demo = plan.runs["demo"]
    assert (demo.nproc, demo.device, demo.backend, demo.env) == (
        2,
        "cpu",
        "gloo",
        {"CUDA_VISIBLE_DEVICES": ""},
    )
    assert plan.line.startswith("nproc = 1, but every demo here needs two ranks: they run 2."), plan.line


def test_the_cpu_keeps_its_sizes_and_gpus_get_resnet50_at_224_px():
    assert dict(plan_for("07", 0, 2, smoke=True).sizes) == {
        "model": "mlp",
        "width": 256,
        "depth": 6,
        "image_size": 64,
        "batch_size": 16,
    }
    assert dict(plan_for("07", 0, 2).sizes) == {
        "model": "mlp",
        "width": 1024,
        "depth": 8,
        "image_size": 64,
        "batch_size": 64,
    }
    gpu = plan_for("07", 2, 2).sizes
    assert (gpu["model"], gpu["image_size"], gpu["batch_size"]) == ("resnet50", 224, 32), gpu
