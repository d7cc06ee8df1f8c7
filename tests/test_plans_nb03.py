"""Notebook 03's plan: the speed runs' sizes by device kind, the runs' lengths (smoke or not), the worker
arguments the lesson and its companion pass, and the overflow demo's second rank."""

from __future__ import annotations

from ddp_helpers.chapters.ch03_mixed_precision.ch03_plan import convergence_args, overflow_args, speed_args
from ddp_helpers.kernel.lab.plans import plan_for

CPU = {"model": "mlp", "image_size": 32, "batch_size": 64, "memory_batch": 64}  # CI's sizes


def _option(args: list[str], name: str) -> list[str]:
    """The values after `name` in a worker's argument list, up to the next option."""
    at = args.index(name) + 1
    values = []
    while at < len(args) and not args[at].startswith("--"):
        values.append(args[at])
        at += 1
    return values


def test_the_cpu_keeps_its_sizes():
    for smoke in (False, True):
        for gpus in (0, 1):  # one GPU and two ranks: the CPU
            sizes = plan_for("03", gpus, 2, smoke=smoke).sizes
            assert {k: sizes[k] for k in CPU} == CPU, sizes


def test_smoke_mode_shortens_the_runs_not_the_sizes():
    full, smoke = plan_for("03", 0, 2).sizes, plan_for("03", 0, 2, smoke=True).sizes
    for key in ("steps", "repeats", "epochs", "fp32_seeds"):
        assert smoke[key] < full[key], (key, smoke[key], full[key])
    assert smoke["repeats"] >= 1 and smoke["fp32_seeds"] >= 2, smoke  # a spread needs two seeds
    assert {k: smoke[k] for k in CPU} == {k: full[k] for k in CPU}


def test_gpus_get_resnet50_at_224_px_and_the_kernel_counts_a_few_images():
    sizes = plan_for("03", 4, 4).sizes
    assert (sizes["model"], sizes["image_size"]) == ("resnet50", 224), sizes
    assert sizes["batch_size"] > CPU["batch_size"] and sizes["memory_batch"] < sizes["batch_size"], sizes


def test_the_speed_runs_arguments_follow_the_device_and_inject_overflows_inside_the_warm_up():
    cpu, gpu = speed_args("cpu", smoke=True), speed_args("cuda", smoke=False)
    assert _option(cpu, "--model") == ["mlp"] and _option(gpu, "--model") == ["resnet50"]
    assert int(_option(cpu, "--steps")[0]) < int(_option(speed_args("cpu", smoke=False), "--steps")[0])
    warmup = int(_option(cpu, "--warmup-steps")[0])
    overflows = [int(s) for s in _option(overflow_args(), "--overflow-at-steps")]
    assert overflows and max(overflows) < warmup, (overflows, warmup)  # the timing never sees one
    assert _option(overflow_args(), "--overflow-rank") == ["1"]
    assert tuple(overflows) == tuple(plan_for("03", 0, 2).sizes["overflow_steps"])
    assert "--amp" not in cpu  # the precision is the caller's


def test_the_convergence_runs_train_the_digits_and_score_them():
    args = convergence_args(smoke=True)
    assert _option(args, "--dataset") == ["digits"] and "--eval" in args
    assert _option(args, "--epochs") == [str(plan_for("03", 0, 2, smoke=True).sizes["epochs"])]


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
