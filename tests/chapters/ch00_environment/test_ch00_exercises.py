"""00-sum's probe values and verdicts, on records as the ranks report them (no ranks: tests/kernel runs the
catalogued wrong answers on live ranks). Each rank's value is drawn anew for each check, so a total rebuilt
without a collective cannot be right, and is named for that."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_helpers.chapters.ch00_environment.ch00_exercises import values_of
from ddp_helpers.kernel.exercises.checker import judge
from ddp_helpers.rank.registry import get


def test_each_check_draws_its_own_digits_each_rank_its_own_decimal_place():
    values = values_of(8, "/runs/exercises/00-sum-1")
    digits = [v / 10**r for r, v in enumerate(values)]
    assert all(d.is_integer() and 2 <= d <= 9 for d in digits), values
    assert len(set(digits)) == 8, "up to 8 ranks no two share a digit"
    assert values_of(8, "/runs/exercises/00-sum-1") == values, "every rank of one check draws the same"
    checks = {tuple(values_of(3, f"/runs/exercises/00-sum-{i}")) for i in range(20)}
    assert len(checks) > 10, "each check draws anew"
    assert all(sum(v) != 111 for v in checks), "no digit is 1: the old pattern's sum is never right"


def _results(totals: list[Any], collectives: list[str]) -> list[dict[str, Any]]:
    """What each rank reports for 00-sum (the probe's observe, run here), for one total per rank: a float
    becomes a float64 tensor; a tensor is taken as it is."""
    import torch

    from ddp_helpers.chapters.ch00_environment.ch00_exercises import SUM
    from ddp_helpers.rank.spec import Context

    world = len(totals)
    results = []
    for rank, total in enumerate(totals):
        if not isinstance(total, torch.Tensor):
            total = torch.tensor([total], dtype=torch.float64)
        ctx = Context(rank, world, rank, torch.device("cpu"), "gloo", "/check")
        observed = SUM.observe({"total": total}, ctx)
        results.append({"rank": rank, "error": None, "collectives": list(collectives), **observed})
    return results


@pytest.mark.parametrize("world", [2, 3])
def test_a_total_rebuilt_without_a_collective_is_named_for_it(world):
    rebuilt = float(sum(10**r for r in range(world)))  # the pattern of the digits, as if every digit were 1
    verdict = judge(get("00-sum"), _results([rebuilt] * world, []))
    assert verdict.diagnosis == "00-sum-no-collective", verdict.text()
    assert "drawn anew for each check" in verdict.message and "dist.all_reduce" in verdict.hint
    own = values_of(world, "/check")
    verdict = judge(get("00-sum"), _results(own, []))  # each rank kept its own value, and called nothing
    assert verdict.diagnosis == "00-sum-no-collective", verdict.text()
    verdict = judge(get("00-sum"), _results(own, ["all_reduce"]))  # reduced a copy
    assert verdict.diagnosis == "00-sum-result-discarded", verdict.text()


def test_the_other_mistakes_are_named_from_the_values_drawn():
    values = values_of(3, "/check")
    cases = {
        "00-sum-averaged": [sum(values) / 3] * 3,
        "00-sum-max": [max(values)] * 3,
        "00-sum-ranks-not-values": [3.0] * 3,
        "00-sum-reduce-to-rank-0": [sum(values), values[1], values[2]],
    }
    for diagnosis, totals in cases.items():
        verdict = judge(get("00-sum"), _results(totals, ["all_reduce"]))
        assert verdict.diagnosis == diagnosis, verdict.text()


def test_a_float32_total_of_eight_ranks_passes_as_float32_rounds_it():
    """Eight digits reach 10**8, past float32's exact integers (2**24): the sum in float32 is right to its
    rounding, and passes; a half-precision total is held to float32's rounding, which no wrong total meets."""
    import torch

    values = values_of(8, "/check")
    in_float32 = torch.tensor(values, dtype=torch.float32).sum().reshape(1)
    verdict = judge(get("00-sum"), _results([in_float32] * 8, ["all_reduce"]))
    assert verdict.passed, verdict.text()
    off = in_float32 * (1 + 8 * torch.finfo(torch.float32).eps) + 10  # more than float32's rounding
    verdict = judge(get("00-sum"), _results([off] * 8, ["all_reduce"]))
    assert not verdict.passed and "not the sum of every rank's value" in verdict.text(), verdict.text()
    in_bfloat16 = torch.tensor([max(values)], dtype=torch.bfloat16)  # bfloat16's rounding would cover a MAX
    assert not judge(get("00-sum"), _results([in_bfloat16] * 8, ["all_reduce"])).passed
