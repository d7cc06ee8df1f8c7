"""Notebook 00's plan: the check on two ranks at least, its largest message by device kind."""

from __future__ import annotations

from ddp_helpers.kernel.lab.plans import plan_for


def test_one_gpu_checks_two_gloo_ranks_with_the_gpu_hidden_and_says_why():
    plan = plan_for("00", 1, 1)
    check = plan.runs["check"]
    assert (check.nproc, check.device, check.backend, check.env) == (
        2,
        "cpu",
        "gloo",
        {"CUDA_VISIBLE_DEVICES": ""},
    )
    assert plan.line.startswith("nproc = 1, but one rank moves no data: the check runs 2."), plan.line


def test_gpus_sweep_to_1_gib_and_the_cpu_to_64_mib():
    assert plan_for("00", 8, 8).sizes == {"max_bytes": 1 << 30}
    assert plan_for("00", 0, 2).sizes == plan_for("00", 1, 2).sizes == {"max_bytes": 1 << 26}
    assert plan_for("00", 0, 2, smoke=True).sizes == {"max_bytes": 1 << 16}
