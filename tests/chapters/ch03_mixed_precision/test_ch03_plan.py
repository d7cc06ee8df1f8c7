"""Notebook 03's plan: the speed and convergence runs on the ranks asked for, the overflow demo on two at least,
the speed runs' sizes by device kind, the runs' lengths (smoke or not), and the worker arguments the lesson
and its companion pass."""

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

from ddp_helpers.chapters.ch03_mixed_precision.ch03_plan import (
    LENGTHS,
    convergence_args,
    overflow_args,
    speed_args,
)
from ddp_helpers.kernel.lab.plan_core import NotebookPlan


def test_the_speed_and_convergence_runs_use_the_ranks_asked_for_and_the_overflow_demo_two_at_least():
    """The overflow demo needs a second rank to disagree with: the rank it makes overflow."""

    def rule(plan: NotebookPlan) -> None:
        for name in ("speed", "converge"):
            placed(plan.machine, plan.runs[name], plan.machine.nproc)
        for name in ("overflow", "exercise"):
            placed(plan.machine, plan.runs[name], at_least_two(plan.machine))
        says_why_it_runs_more(plan, plan.runs["overflow"])
        overflow_rank = int(option(overflow_args(), "--overflow-rank")[0])
        assert 0 < overflow_rank < plan.runs["overflow"].nproc, overflow_rank  # one overflows, one does not

    every_shape("03", rule)


def test_the_cpu_runs_the_mlp_and_gpus_a_heavier_model_on_larger_images_and_batches():
    """16-bit convolutions on a CPU without bf16/fp16 instructions run many times slower than fp32; GPUs need
    work where tensor cores show. The kernel counts saved bytes on the CPU: on GPUs for a few images only."""
    sizes = sizes_by_kind("03")
    cpu, gpu = sizes["cpu", False], sizes["cuda", False]
    assert cpu["model"] == "mlp" and heavier(gpu["model"], than=cpu["model"]), (cpu, gpu)
    assert gpu["image_size"] > cpu["image_size"] and gpu["batch_size"] > cpu["batch_size"], (cpu, gpu)
    assert cpu["memory_batch"] == cpu["batch_size"], cpu
    assert 0 < gpu["memory_batch"] < gpu["batch_size"], gpu


def test_smoke_mode_shortens_the_runs_never_the_sizes():
    sizes = sizes_by_kind("03")
    for kind in KINDS:
        full, smoke = sizes[kind, False], sizes[kind, True]
        for key, length in LENGTHS[True].items():
            assert smoke[key] == length < full[key] == LENGTHS[False][key], (kind, key, smoke, full)
        assert smoke["repeats"] >= 1 and smoke["fp32_seeds"] >= 2, smoke  # a spread needs two seeds
        assert {k: v for k, v in smoke.items() if k not in LENGTHS[True]} == {
            k: v for k, v in full.items() if k not in LENGTHS[False]
        }, (smoke, full)


def test_the_speed_runs_arguments_follow_the_plan_and_inject_overflows_inside_the_untimed_warm_up():
    sizes = sizes_by_kind("03")
    overflows = [int(s) for s in option(overflow_args(), "--overflow-at-steps")]
    for kind in KINDS:
        for smoke in (False, True):
            args, planned = speed_args(kind, smoke), sizes[kind, smoke]
            for key in ("model", "image_size", "batch_size", "steps"):
                assert option(args, "--" + key.replace("_", "-")) == [str(planned[key])], (kind, key, args)
            warmup = int(option(args, "--warmup-steps")[0])
            assert overflows and max(overflows) < warmup < planned["steps"], (overflows, warmup, args)
            assert tuple(overflows) == tuple(planned["overflow_steps"]), planned
            assert "--amp" not in args  # the precision is the caller's


def test_the_convergence_runs_train_the_digits_for_the_plans_epochs_and_score_them():
    for smoke in (False, True):
        args = convergence_args(smoke)
        assert option(args, "--dataset") == ["digits"] and "--eval" in args, args
        assert option(args, "--epochs") == [str(sizes_by_kind("03")["cpu", smoke]["epochs"])], args
