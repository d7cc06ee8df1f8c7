"""Notebook 02's sizes by device kind: GPUs get steps long enough for DDP's all-reduce to hide."""

from __future__ import annotations

from ddp_helpers.kernel.lab.plans import plan_for

CPU = {"model": "resnet18", "image_size": 32, "num_samples": 2048, "batch_size": 32}  # CI's sizes


def test_the_cpu_keeps_its_sizes_and_smoke_mode_its_mlp():
    assert dict(plan_for("02", 0, 2).sizes) == CPU
    assert dict(plan_for("02", 1, 2).sizes) == CPU  # fewer GPUs than ranks: every run on the CPU
    assert dict(plan_for("02", 0, 2, smoke=True).sizes) == {**CPU, "model": "mlp"}


def test_gpus_get_resnet50_at_224_px_and_a_larger_batch():
    for smoke in (False, True):
        sizes = plan_for("02", 8, 8, smoke=smoke).sizes
        assert sizes["model"] == "resnet50" and sizes["image_size"] == 224, sizes
        assert sizes["batch_size"] > CPU["batch_size"], sizes
        assert plan_for("02", 1, 1, smoke=smoke).sizes == sizes  # by device kind, not by count


def test_one_gpu_runs_the_throughput_on_it_and_the_live_demos_on_two_gloo_ranks_and_says_so():
    plan = plan_for("02", 1, 1)
    assert (plan.device, plan.runs["ddp"].nproc) == ("cuda", 1)
    demo = plan.runs["demo"]
    assert (demo.nproc, demo.device, demo.backend, demo.env) == (
        2,
        "cpu",
        "gloo",
        {"CUDA_VISIBLE_DEVICES": ""},
    )
    assert "The demos on live ranks need two at least" in plan.line, plan.line
    assert all("demo" not in group for group in plan.compared[:1])  # never beside the GPU's throughput runs


def test_every_throughput_run_times_the_same_steps_after_its_warmup_and_smoke_shortens_them():
    from ddp_helpers.chapters.ch02_single_dp_ddp import ch02_plan as nb02

    for smoke in (False, True):
        args = nb02.throughput_args(plan_for("02", 0, 2, smoke=smoke).sizes, smoke)
        steps, warmup = (int(args[args.index(flag) + 1]) for flag in ("--steps", "--warmup-steps"))
        assert steps - warmup == nb02.timed_steps(smoke), args
        assert args[args.index("--model") + 1] == plan_for("02", 0, 2, smoke=smoke).sizes["model"]
    assert nb02.timed_steps(True) < nb02.timed_steps(False)


def test_the_equality_and_learning_rate_runs_use_the_mlp():
    from ddp_helpers.chapters.ch02_single_dp_ddp import ch02_plan as nb02

    # no BatchNorm: DDP is then exactly a bigger batch
    for args in (nb02.equality_args(), nb02.lr_args(smoke=True)):
        assert args[args.index("--model") + 1] == "mlp", args
    assert "--deterministic" in nb02.equality_args()
