"""Notebook 00's plan: the all_reduce check on two ranks at least, its sweep's largest message by device kind."""

from __future__ import annotations

from plan_rules import KINDS, at_least_two, every_shape, placed, says_why_it_runs_more, sizes_by_kind

from ddp_helpers.kernel.lab.plan_core import NotebookPlan

MIB = 1 << 20


def test_the_check_runs_the_ranks_asked_for_or_two_and_says_why():
    """One rank moves no data."""

    def rule(plan: NotebookPlan) -> None:
        check = plan.runs["check"]
        placed(plan.machine, check, at_least_two(plan.machine))
        says_why_it_runs_more(plan, check)

    every_shape("00", rule)


def test_gpus_sweep_past_64_mib_a_cpu_to_64_mib_at_most_and_smoke_mode_to_less():
    """NVLink's bus bandwidth can still be rising at 64 MiB; a CPU's gloo needs no more."""
    sizes = sizes_by_kind("00")
    assert sizes["cuda", False]["max_bytes"] > 64 * MIB >= sizes["cpu", False]["max_bytes"], sizes
    for kind in KINDS:
        assert sizes[kind, True]["max_bytes"] < sizes[kind, False]["max_bytes"], (kind, sizes)
