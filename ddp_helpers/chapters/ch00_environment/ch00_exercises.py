"""Notebook 00's exercises: sum one number from every rank (all_reduce), then compute algbw and busbw.

Probe inputs make each mistake leave its own mark: 00-sum's digits say which ranks contributed; 00-busbw
calls the answer with 2-, 4- and 8-byte elements and worlds of 3, 4 and 8 (where the ring's factor is not 1).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen

# ------------------------------------------------------------------ 00-sum
THE_SUM = "the sum of every rank's value"


def values_of(world: int, check: str) -> list[float]:
    """Rank r holds d * 10**r, d drawn (2 to 9, distinct up to 8 ranks) from `check`, the check's folder."""
    draw = random.Random(f"00-sum {check}")
    digits = draw.sample(range(2, 10), world) if world <= 8 else [draw.randint(2, 9) for _ in range(world)]
    return [float(d * 10**r) for r, d in enumerate(digits)]


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


def _sum_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import torch

    values = values_of(ctx.world_size, ctx.workdir)
    if "total" not in ns:
        raise NameError("your answer bound no `total`")
    total = ns["total"]
    if not isinstance(total, torch.Tensor):
        return {"total": f"{total!r}"[:60], "kind": type(total).__name__, "held": None, "values": values}
    held = sorted(set(total.detach().to("cpu", torch.float64).flatten().tolist()))
    # float32's rounding at most: a half-precision total's could hide a MAX (within 3 % at 8 ranks)
    tolerance = 0.0
    if total.is_floating_point():
        tolerance = min(torch.finfo(total.dtype).eps, torch.finfo(torch.float32).eps) * ctx.world_size
    every = sum(values)
    if _close_to(held, [every], tolerance):
        said = THE_SUM
    else:
        shown = ", ".join(_number(v) for v in held[:4]) + (", ..." if len(held) > 4 else "")
        said = f"{shown}: not {THE_SUM} ({' + '.join(map(_number, values))} = {_number(every)})"
    return {"total": said, "kind": "Tensor", "held": held, "values": values, "tolerance": tolerance}


def _sum_expected(world: int) -> Seen:
    return [{"total": THE_SUM, "kind": "Tensor"} for _ in range(world)]


def _close_to(held: list[float] | None, wanted: list[float], tolerance: float = 0.0) -> bool:
    return (
        held is not None
        and len(held) == len(wanted)
        and all(math.isclose(h, w, rel_tol=tolerance) for h, w in zip(held, wanted, strict=True))
    )


def _totals(seen: Seen, wanted: Callable[[list[float], int], float]) -> list[bool]:
    values = list(seen[0]["values"])
    return [
        _close_to(s.get("held"), [wanted(values, r)], s.get("tolerance", 0.0)) for r, s in enumerate(seen)
    ]


def _every_total(wanted: Callable[[list[float], int], float]) -> Callable[[Seen, Seen], bool]:
    return lambda seen, expected: len(seen) > 1 and all(_totals(seen, wanted))


def _only_rank_0(seen: Seen, expected: Seen) -> bool:
    summed = _totals(seen, lambda values, r: sum(values))
    return len(seen) > 1 and summed[0] and not all(summed)


SUM = Exercise(
    id="00-sum",
    notebook="00",
    title="Every rank gets the sum of every rank's value",
    task="Make `total`, a tensor on `device` holding the sum of every rank's `value`, on every rank.",
    starter=(
        "total = ...  # TODO: a tensor on `device` holding this rank's value\n"
        "...  # TODO: one collective, so that every rank's total holds the sum\n"
    ),
    reference=(
        "total = torch.tensor([value], dtype=torch.float64, device=device)  # this rank's share\n"
        "dist.all_reduce(total)  # SUM by default, in place: total now holds the sum on every rank\n"
    ),
    hint="One collective leaves every rank the sum of every rank's tensor, in place.",
    setup=lambda ctx: {"value": values_of(ctx.world_size, ctx.workdir)[ctx.rank]},
    observe=_sum_observe,
    expected=_sum_expected,
    mistakes=(
        Mistake(
            "00-sum-no-collective",
            "No rank called a collective: the others' values are drawn anew for each check and reach a rank "
            "only through one.",
            lambda seen, expected: len(seen) > 1 and all(not s.get("collectives") for s in seen),
            hint="Put this rank's value in a tensor and call dist.all_reduce(total) on every rank.",
        ),
        Mistake(
            "00-sum-averaged",
            "Every rank holds the mean, not the sum: the answer divided by the world size.",
            _every_total(lambda values, r: sum(values) / len(values)),
            hint="Leave the all-reduced tensor as it is: SUM is all_reduce's default op.",
        ),
        Mistake(
            "00-sum-returned-none",
            "total is None: dist.all_reduce works in place and returns None.",
            lambda seen, expected: all(s.get("kind") == "NoneType" for s in seen),
            hint="Build `total` first, then call dist.all_reduce(total) on a line of its own.",
        ),
        Mistake(
            "00-sum-reduce-to-rank-0",
            "Only rank 0 holds the sum: dist.reduce delivers to one rank.",
            _only_rank_0,
            hint="Call dist.all_reduce(total), which delivers to every rank.",
        ),
        Mistake(
            "00-sum-max",
            "Every rank holds the largest value, not the sum: op=ReduceOp.MAX.",
            _every_total(lambda values, r: max(values)),
            hint="Use all_reduce's default op, SUM.",
        ),
        Mistake(
            "00-sum-ranks-not-values",
            "Every rank holds 0 + 1 + ... + (n-1): each rank handed in its rank, not its value.",
            _every_total(lambda values, r: float(sum(range(len(values))))),
            hint="Put `value` into the tensor, not the rank number.",
        ),
        Mistake(
            "00-sum-result-discarded",
            "Each rank still holds its own value: the all-reduce ran on another tensor.",
            _every_total(lambda values, r: values[r]),
            hint="All-reduce the very tensor you bind to `total`.",
        ),
    ),
)

# ------------------------------------------------------------------ 00-busbw
# (dtype, elements, seconds, world): 2-, 4- and 8-byte elements, and worlds where 2(n-1)/n is not 1
PROBES = (("bfloat16", 3000, 2.5e-6, 3), ("float32", 1 << 12, 1e-5, 4), ("float64", 500, 4e-6, 8))


def element_size(dtype: str) -> int:
    return {"bfloat16": 2, "float32": 4, "float64": 8}[dtype]


def _busbw_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import torch

    function = ns.get("bandwidths")
    if not callable(function):
        raise NameError("your answer defined no function `bandwidths(tensor, seconds, world)`")
    rows = []
    for dtype, numel, seconds, world in PROBES:
        algbw, busbw = function(torch.zeros(numel, dtype=getattr(torch, dtype)), seconds, world)
        rows.append([float(algbw), float(busbw)])
    return {"gbps": rows}


def right_bandwidths(dtype: str, numel: int, seconds: float, world: int) -> list[float]:
    """algbw and busbw in GB/s, from first principles (nccl-tests' PERFORMANCE.md)."""
    algbw = numel * element_size(dtype) / seconds / 1e9
    return [algbw, algbw * 2 * (world - 1) / world]


def _busbw_expected(world: int) -> Seen:
    return [{"gbps": [right_bandwidths(*p) for p in PROBES]} for _ in range(world)]


def _ratios_are(seen: Seen, algbw: list[float], busbw: list[float] | None = None) -> bool:
    """Rank 0's algbw (and busbw) over the right ones are, probe by probe, these."""
    rows = seen[0].get("gbps") or []
    right = [right_bandwidths(*p) for p in PROBES]
    return (
        bool(rows)
        and len(rows) == len(PROBES)
        and all(
            math.isclose(row[column] / want[column], ratio, rel_tol=1e-6)
            for column, ratios in enumerate((algbw, busbw))
            if ratios is not None
            for row, want, ratio in zip(rows, right, ratios, strict=True)
        )
    )


SIZES = [element_size(p[0]) for p in PROBES]  # each probe's bytes per element
RING = [2 * (p[3] - 1) / p[3] for p in PROBES]  # each probe's ring factor, 2(n-1)/n
GIB = 1e9 / 2**30  # GB/s in GiB/s

BUSBW = Exercise(
    id="00-busbw",
    notebook="00",
    title="algbw and busbw from one timed all-reduce",
    task="Write `bandwidths(tensor, seconds, world)` returning (algbw, busbw) in GB/s (10**9 bytes a second).",
    starter=(
        "def bandwidths(tensor, seconds, world):\n"
        "    nbytes = ...  # TODO: the message's size in bytes\n"
        "    algbw = ...  # TODO: GB/s, as the program sees it\n"
        "    busbw = ...  # TODO: GB/s, as the ring's links carry it\n"
        "    return algbw, busbw\n"
    ),
    reference=(
        "def bandwidths(tensor, seconds, world):\n"
        "    nbytes = tensor.numel() * tensor.element_size()  # bytes, not elements\n"
        "    algbw = nbytes / seconds / 1e9\n"
        "    busbw = algbw * 2 * (world - 1) / world  # reduce-scatter, then all-gather\n"
        "    return algbw, busbw\n"
    ),
    hint="Count bytes, not elements; a ring sends (n-1)/n of the message to reduce-scatter and again to all-gather.",
    setup=lambda ctx: {"math": math},
    observe=_busbw_observe,
    expected=_busbw_expected,
    mistakes=(
        Mistake(
            "00-busbw-four-bytes",
            "Right for float32 only: the answer counts 4 bytes per element whatever the dtype.",
            lambda seen, expected: _ratios_are(seen, [4 / size for size in SIZES]),
            hint="Multiply numel() by tensor.element_size().",
        ),
        Mistake(
            "00-busbw-elements",
            "algbw is each message's element size (2, 4, 8) too small: it counts elements, not bytes.",
            lambda seen, expected: _ratios_are(seen, [1 / size for size in SIZES]),
            hint="nbytes = tensor.numel() * tensor.element_size().",
        ),
        Mistake(
            "00-busbw-no-factor",
            "busbw equals algbw at every world: the ring's factor 2(n-1)/n is missing.",
            lambda seen, expected: _ratios_are(seen, [1.0] * 3, [1 / f for f in RING]),
            hint="Multiply algbw by 2 * (world - 1) / world.",
        ),
        Mistake(
            "00-busbw-half-ring",
            "busbw is half the right one: (n-1)/n counts the reduce-scatter alone.",
            lambda seen, expected: _ratios_are(seen, [1.0] * 3, [0.5] * 3),
            hint="Count the all-gather too: busbw = algbw * 2 * (world - 1) / world.",
        ),
        Mistake(
            "00-busbw-gibibytes",
            "Both bandwidths are 0.931 of the right ones: GiB/s (2**30), where GB/s (10**9) was asked.",
            lambda seen, expected: _ratios_are(seen, [GIB] * 3, [GIB] * 3),  # GiB/s where GB/s was asked
            hint="Divide bytes per second by 1e9, not by 2**30.",
        ),
    ),
)

EXERCISES = (SUM, BUSBW)
