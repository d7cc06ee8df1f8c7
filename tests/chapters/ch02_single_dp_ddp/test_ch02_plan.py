"""Notebook 02's plan: the throughput runs (test_ch02_throughput_plan.py holds their rules), the demos on live ranks two
at least, sizes by device kind (GPUs get steps long enough for DDP's all-reduce to hide), and the worker
arguments the lesson and its companion pass."""

from __future__ import annotations

from plan_rules import (
    KINDS,
    at_least_two,
    every_shape,
    heavier,
    option,
    placed,
    says_why_it_runs_more,
    sizes_by_kind,
)

from ddp_helpers.chapters.ch02_single_dp_ddp import ch02_plan as nb02
from ddp_helpers.kernel.lab.plan_core import NotebookPlan

THROUGHPUT = ("single", "dataparallel", "ddp")


def test_the_throughput_runs_are_compared_together_and_the_demos_apart_on_two_ranks_at_least():
    def rule(plan: NotebookPlan) -> None:
        m = plan.machine
        sweep = [f"sweep-{n}" for n in sorted({n for n in (1, 2, 4, 8) if n <= m.nproc} | {m.nproc})]
        assert plan.compared[0] == (*THROUGHPUT, *sweep), plan.compared
        assert all("demo" not in group or group == ("demo",) for group in plan.compared), plan.compared
        for name in ("demo", "exercise"):
            placed(m, plan.runs[name], at_least_two(m))
        says_why_it_runs_more(plan, plan.runs["demo"])

    every_shape("02", rule)


def test_gpus_get_a_heavier_model_larger_images_and_batches_and_smoke_mode_the_mlp_on_the_cpu_only():
    sizes = sizes_by_kind("02")
    cpu, gpu = sizes["cpu", False], sizes["cuda", False]
    assert heavier(gpu["model"], than=cpu["model"]), (cpu, gpu)
    assert gpu["image_size"] > cpu["image_size"] and gpu["batch_size"] > cpu["batch_size"], (cpu, gpu)
    assert sizes["cpu", True] == {**cpu, "model": "mlp"}  # CI's smoke run: the MLP, nothing else changed
    assert sizes["cuda", True] == gpu  # a GPU runs its sizes in seconds


def test_every_throughput_run_times_the_same_steps_after_its_warmup_and_smoke_shortens_them():
    by_kind = sizes_by_kind("02")
    for kind in KINDS:
        for smoke in (False, True):
            sizes = by_kind[kind, smoke]
            args = nb02.throughput_args(sizes, smoke)
            steps, warmup = (int(option(args, flag)[0]) for flag in ("--steps", "--warmup-steps"))
            assert steps - warmup == nb02.TIMED_STEPS[smoke], args
            assert option(args, "--model") == [sizes["model"]], args
            assert "--batch-size" not in args and "--mode" not in args, args  # the caller's
    assert nb02.TIMED_STEPS[True] < nb02.TIMED_STEPS[False]


def test_the_equality_and_learning_rate_runs_use_the_mlp():
    # no BatchNorm: DDP is then exactly a bigger batch
    for args in (nb02.equality_args(), nb02.lr_args(smoke=True), nb02.lr_args(smoke=False)):
        assert option(args, "--model") == ["mlp"], args
    assert "--deterministic" in nb02.equality_args()
