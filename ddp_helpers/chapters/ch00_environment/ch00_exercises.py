"""Notebook 00's exercises: sum one number from every rank (all_reduce), then compute algbw and busbw.

Probe inputs make each mistake leave its own mark. In 00-sum rank r holds d * 10**r, its digit d drawn
for each check (2 to 9, a different digit on each rank where there are 8 ranks or fewer): the sum's decimal
digits say which ranks contributed, and no rank can rebuild the others' values without a collective (a
total made from the rank's own value and the pattern alone is named for it). A MAX gives the last rank's
value, the ranks' own numbers give 0 + 1 + 2 = 3, a reduce to rank 0 leaves the others without the sum, and
a discarded result leaves each rank its own value. In 00-busbw the learner's function is called with
messages of three dtypes (2, 4 and 8 bytes an element) and worlds of 3, 4 and 8 ranks (at 2 ranks the
ring's factor is 1 and hides a missing one), so that elements for bytes, a missing factor and half of it
each give their own ratios.
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
    """Every rank's value in one check of 00-sum: rank r holds d * 10**r, one digit d (2 to 9) per rank.

    The digits are drawn from `check` (the check's own folder, fresh each check and the same on every rank),
    so each rank's probe knows every value, while the answer is given its own rank's only. No digit is 1
    (the sum is never 11...1) and, up to 8 ranks, no two ranks share one."""
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
    # the distinct values in the tensor: a right answer holds the sum in every element, whatever its shape
    held = sorted(set(total.detach().to("cpu", torch.float64).flatten().tolist()))
    # to float32's rounding at most, which a sum of 8 ranks' digits (up to 10**8) meets: a half-precision
    # total, whose rounding could hide a wrong one (a MAX can be within 3 % of the sum at 8 ranks), is held to it
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
    """The distinct values a total held are `wanted`, to `tolerance` (relative: its dtype's rounding)."""
    return (
        held is not None
        and len(held) == len(wanted)
        and all(math.isclose(h, w, rel_tol=tolerance) for h, w in zip(held, wanted, strict=True))
    )


def _totals(seen: Seen, wanted: Callable[[list[float], int], float]) -> list[bool]:
    """Per rank r: its total held one value, wanted(every rank's value, r), to its dtype's rounding."""
    values = list(seen[0]["values"])
    return [
        _close_to(s.get("held"), [wanted(values, r)], s.get("tolerance", 0.0)) for r, s in enumerate(seen)
    ]


def _every_total(wanted: Callable[[list[float], int], float]) -> Callable[[Seen, Seen], bool]:
    """A signature: more than one rank, and each rank's total is wanted(every rank's value, its rank)."""
    return lambda seen, expected: len(seen) > 1 and all(_totals(seen, wanted))


def _only_rank_0(seen: Seen, expected: Seen) -> bool:
    summed = _totals(seen, lambda values, r: sum(values))
    return len(seen) > 1 and summed[0] and not all(summed)


SUM = Exercise(
    id="00-sum",
    notebook="00",
    title="Every rank gets the sum of every rank's value",
    task=(
        "Each rank holds `value`, a number of its own, drawn anew for each check: one digit at the rank's "
        "decimal place (rank 0 holds 2 to 9, rank 1 a multiple of 10, rank 2 of 100, ...), so the sum's digits "
        "show who took part, and no rank knows another's value unless they communicate. Make `total`, a "
        "tensor on `device`, that holds the sum of every rank's value, on every rank."
    ),
    given="`value` (this rank's number), `rank`, `world_size`, `device`, `torch`, `dist`",
    starter=(
        "total = ...  # TODO: a tensor on `device` holding this rank's value\n"
        "...  # TODO: one collective, so that every rank's total holds the sum\n"
    ),
    reference=(
        "total = torch.tensor([value], dtype=torch.float64, device=device)  # this rank's share\n"
        "dist.all_reduce(total)  # SUM by default, in place: total now holds the sum on every rank\n"
    ),
    hint="One collective gives every rank the same reduced tensor, in place. Its default operation adds; "
    "each rank hands in its own value.",
    setup=lambda ctx: {"value": values_of(ctx.world_size, ctx.workdir)[ctx.rank]},
    observe=_sum_observe,
    expected=_sum_expected,
    mistakes=(
        Mistake(
            "00-sum-no-collective",
            "no rank called a collective: each rank built its total from what it knew alone (its own value, "
            "the pattern of the digits), but every rank's digit is drawn anew for each check and given to that "
            "rank alone, so the others' values reach a rank only through a collective",
            lambda seen, expected: len(seen) > 1 and all(not s.get("collectives") for s in seen),
            hint="Put this rank's value in a tensor and let the ranks add them: dist.all_reduce(total) on every "
            "rank leaves the sum of all of them in each rank's tensor.",
        ),
        Mistake(
            "00-sum-averaged",
            "every rank holds the mean of the values, not their sum: the answer divided by the world size. "
            "all_reduce adds (its default op is SUM); DDP's gradient is a mean because DDP divides, after it",
            _every_total(lambda values, r: sum(values) / len(values)),
            hint="Leave the all-reduced tensor as it is: SUM, all_reduce's default op, already leaves the "
            "total on every rank.",
        ),
        Mistake(
            "00-sum-returned-none",
            "total is None on every rank: dist.all_reduce changes its tensor in place and returns None "
            "(a work handle only with async_op=True); call it, then keep the tensor you passed",
            lambda seen, expected: all(s.get("kind") == "NoneType" for s in seen),
            hint="Build `total` as a tensor first, then call dist.all_reduce(total) on a line of its own: it "
            "fills `total` in place.",
        ),
        Mistake(
            "00-sum-reduce-to-rank-0",
            "only rank 0 holds the sum: dist.reduce delivers the result to one rank (dst); all_reduce "
            "delivers it to every rank",
            _only_rank_0,
            hint="Call dist.all_reduce(total), which leaves the sum on every rank, in place of dist.reduce.",
        ),
        Mistake(
            "00-sum-max",
            "every rank holds the largest value, not the sum: op=ReduceOp.MAX keeps the biggest; the "
            "default op, SUM, adds",
            _every_total(lambda values, r: max(values)),
            hint="Call dist.all_reduce(total) with its default op, SUM, in place of ReduceOp.MAX.",
        ),
        Mistake(
            "00-sum-ranks-not-values",
            "every rank holds 0 + 1 + ... + (n-1), the sum of the rank numbers: each rank handed in its "
            "rank instead of its value, so rank 0 added nothing",
            _every_total(lambda values, r: float(sum(range(len(values))))),
            hint="Put this rank's `value` into the tensor that every rank all-reduces, in place of its rank number.",
        ),
        Mistake(
            "00-sum-result-discarded",
            "each rank still holds only its own value: the all-reduce ran on another tensor (a copy?), "
            "and total never received the sum",
            _every_total(lambda values, r: values[r]),
            hint="All-reduce the very tensor you bind to `total`: dist.all_reduce changes the tensor it is "
            "given, in place.",
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
    """Rank 0's algbw (and busbw) over the right ones are, probe by probe, these (every rank computes alike)."""
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
    task=(
        "Write `bandwidths(tensor, seconds, world)`: `tensor` is the message each rank all-reduced, "
        "`seconds` how long the slowest rank took, `world` the number of ranks. Return (algbw, busbw) "
        "in GB/s (10**9 bytes a second)."
    ),
    given="`torch`, `math`; the checker calls your function with messages of several dtypes and worlds",
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
    hint="A bandwidth counts bytes: an element of bfloat16 is 2 bytes, of float64 8. In a ring each rank sends "
    "(n-1)/n of the message to reduce-scatter it, and (n-1)/n again to all-gather the sums.",
    setup=lambda ctx: {"math": math},
    observe=_busbw_observe,
    expected=_busbw_expected,
    mistakes=(
        Mistake(
            "00-busbw-four-bytes",
            "right for float32 only: the answer counts 4 bytes per element, but a bfloat16 element is 2 bytes "
            "and a float64 one 8. tensor.element_size() says how many",
            lambda seen, expected: _ratios_are(seen, [4 / size for size in SIZES]),
            hint="Multiply numel() by tensor.element_size(), the bytes of one element of the tensor's own "
            "dtype.",
        ),
        Mistake(
            "00-busbw-elements",
            "algbw is the right one divided by each message's element size (2, 4, 8): it counts elements, "
            "not bytes; numel() * element_size() is the message in bytes",
            lambda seen, expected: _ratios_are(seen, [1 / size for size in SIZES]),
            hint="Turn elements into bytes: nbytes = tensor.numel() * tensor.element_size().",
        ),
        Mistake(
            "00-busbw-no-factor",
            "busbw equals algbw at every world: it lacks the ring's factor 2(n-1)/n (1 at 2 ranks only, "
            "which is why the checker asks at 3, 4 and 8)",
            lambda seen, expected: _ratios_are(seen, [1.0] * 3, [1 / f for f in RING]),
            hint="Multiply algbw by 2 * (world - 1) / world: the ring's reduce-scatter and its all-gather each "
            "send (world - 1) / world of the message.",
        ),
        Mistake(
            "00-busbw-half-ring",
            "busbw is half the right one: (n-1)/n counts the reduce-scatter alone; the all-gather sends "
            "(n-1)/n again, 2(n-1)/n in all",
            lambda seen, expected: _ratios_are(seen, [1.0] * 3, [0.5] * 3),
            hint="Count both halves of the ring: busbw = algbw * 2 * (world - 1) / world.",
        ),
        Mistake(
            "00-busbw-gibibytes",
            "both bandwidths are 0.931 of the right ones (10**9 / 2**30): they are in GiB/s, 2**30 bytes a "
            "second, where the task asks GB/s, 10**9 bytes a second, the unit nccl-tests reports in",
            lambda seen, expected: _ratios_are(seen, [GIB] * 3, [GIB] * 3),  # GiB/s where GB/s was asked
            hint="Divide bytes per second by 1e9 (GB, as link speeds are counted), not by 2**30 (GiB, as "
            "memory sizes are).",
        ),
    ),
)

EXERCISES = (SUM, BUSBW)
