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


def _sum_setup(ctx: Context) -> dict[str, Any]:
    return {"value": values_of(ctx.world_size, ctx.workdir)[ctx.rank]}


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


def _values(seen: Seen) -> list[float]:
    return list(seen[0]["values"])


def _close_to(held: list[float] | None, wanted: list[float], tolerance: float = 0.0) -> bool:
    """The distinct values a total held are `wanted`, to `tolerance` (relative: its dtype's rounding)."""
    return (
        held is not None
        and len(held) == len(wanted)
        and all(math.isclose(h, w, rel_tol=tolerance) for h, w in zip(held, wanted, strict=True))
    )


def _totals_are(seen: Seen, wanted: list[list[float]]) -> list[bool]:
    """Per rank: the distinct values its total held are that rank's `wanted`, to its dtype's rounding."""
    return [_close_to(s.get("held"), w, s.get("tolerance", 0.0)) for s, w in zip(seen, wanted, strict=True)]


def _returned_none(seen: Seen, expected: Seen) -> bool:
    return all(s.get("kind") == "NoneType" for s in seen)


def _no_collective(seen: Seen, expected: Seen) -> bool:
    """No rank called any collective: a total built from what each rank knew alone."""
    return len(seen) > 1 and all(not s.get("collectives") for s in seen)


def _only_rank_0(seen: Seen, expected: Seen) -> bool:
    summed = _totals_are(seen, [[sum(_values(seen))]] * len(seen))
    return len(seen) > 1 and summed[0] and not all(summed)


def _largest(seen: Seen, expected: Seen) -> bool:
    return len(seen) > 1 and all(_totals_are(seen, [[max(_values(seen))]] * len(seen)))


def _ranks_summed(seen: Seen, expected: Seen) -> bool:
    world = len(seen)
    return world > 1 and all(_totals_are(seen, [[float(sum(range(world)))]] * world))


def _averaged(seen: Seen, expected: Seen) -> bool:
    mean = sum(_values(seen)) / len(seen)
    return len(seen) > 1 and all(_totals_are(seen, [[mean]] * len(seen)))


def _kept_own(seen: Seen, expected: Seen) -> bool:
    return len(seen) > 1 and all(_totals_are(seen, [[v] for v in _values(seen)]))


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
    hint=(
        "One collective gives every rank the same reduced tensor, in place. Its default operation adds; "
        "each rank hands in its own value."
    ),
    setup=_sum_setup,
    observe=_sum_observe,
    expected=_sum_expected,
    mistakes=(
        Mistake(
            "00-sum-no-collective",
            "no rank called a collective: each rank built its total from what it knew alone (its own value, "
            "the pattern of the digits), but every rank's digit is drawn anew for each check and given to that "
            "rank alone, so the others' values reach a rank only through a collective",
            _no_collective,
            hint=(
                "Put this rank's value in a tensor and let the ranks add them: dist.all_reduce(total) on every "
                "rank leaves the sum of all of them in each rank's tensor."
            ),
        ),
        Mistake(
            "00-sum-averaged",
            "every rank holds the mean of the values, not their sum: the answer divided by the world size. "
            "all_reduce adds (its default op is SUM); DDP's gradient is a mean because DDP divides, after it",
            _averaged,
            hint=(
                "Leave the all-reduced tensor as it is: SUM, all_reduce's default op, already leaves the "
                "total on every rank."
            ),
        ),
        Mistake(
            "00-sum-returned-none",
            "total is None on every rank: dist.all_reduce changes its tensor in place and returns None "
            "(a work handle only with async_op=True); call it, then keep the tensor you passed",
            _returned_none,
            hint=(
                "Build `total` as a tensor first, then call dist.all_reduce(total) on a line of its own: it "
                "fills `total` in place."
            ),
        ),
        Mistake(
            "00-sum-reduce-to-rank-0",
            "only rank 0 holds the sum: dist.reduce delivers the result to one rank (dst); all_reduce "
            "delivers it to every rank",
            _only_rank_0,
            hint=(
                "Call dist.all_reduce(total), which leaves the sum on every rank, in place of dist.reduce."
            ),
        ),
        Mistake(
            "00-sum-max",
            "every rank holds the largest value, not the sum: op=ReduceOp.MAX keeps the biggest; the "
            "default op, SUM, adds",
            _largest,
            hint="Call dist.all_reduce(total) with its default op, SUM, in place of ReduceOp.MAX.",
        ),
        Mistake(
            "00-sum-ranks-not-values",
            "every rank holds 0 + 1 + ... + (n-1), the sum of the rank numbers: each rank handed in its "
            "rank instead of its value, so rank 0 added nothing",
            _ranks_summed,
            hint=(
                "Put this rank's `value` into the tensor that every rank all-reduces, in place of its rank number."
            ),
        ),
        Mistake(
            "00-sum-result-discarded",
            "each rank still holds only its own value: the all-reduce ran on another tensor (a copy?), "
            "and total never received the sum",
            _kept_own,
            hint=(
                "All-reduce the very tensor you bind to `total`: dist.all_reduce changes the tensor it is "
                "given, in place."
            ),
        ),
    ),
)

# ------------------------------------------------------------------ 00-busbw
# (dtype, elements, seconds, world): 2-, 4- and 8-byte elements, and worlds where 2(n-1)/n is not 1
PROBES = (("bfloat16", 3000, 2.5e-6, 3), ("float32", 1 << 12, 1e-5, 4), ("float64", 500, 4e-6, 8))


def element_size(dtype: str) -> int:
    return {"bfloat16": 2, "float32": 4, "float64": 8}[dtype]


def _busbw_setup(ctx: Context) -> dict[str, Any]:
    return {"math": math}


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


def _ratios(seen: Seen, column: int, reference: list[float]) -> list[float] | None:
    """Each probe's seen value over `reference`, on rank 0 (every rank computes the same)."""
    rows = seen[0].get("gbps")
    if not rows or len(rows) != len(PROBES):
        return None
    return [row[column] / want for row, want in zip(rows, reference, strict=True)]


def _ratios_are(seen: Seen, column: int, reference: list[float], wanted: list[float]) -> bool:
    ratios = _ratios(seen, column, reference)
    return ratios is not None and all(
        math.isclose(r, w, rel_tol=1e-6) for r, w in zip(ratios, wanted, strict=True)
    )


def _right(column: int) -> list[float]:
    return [right_bandwidths(*p)[column] for p in PROBES]


def _counted_elements(seen: Seen, expected: Seen) -> bool:
    return _ratios_are(seen, 0, _right(0), [1 / element_size(p[0]) for p in PROBES])


def _four_bytes(seen: Seen, expected: Seen) -> bool:
    return _ratios_are(seen, 0, _right(0), [4 / element_size(p[0]) for p in PROBES])


def _no_factor(seen: Seen, expected: Seen) -> bool:
    factors = [2 * (p[3] - 1) / p[3] for p in PROBES]
    return _ratios_are(seen, 0, _right(0), [1.0] * 3) and _ratios_are(
        seen, 1, _right(1), [1 / f for f in factors]
    )


def _half_ring(seen: Seen, expected: Seen) -> bool:
    return _ratios_are(seen, 0, _right(0), [1.0] * 3) and _ratios_are(seen, 1, _right(1), [0.5] * 3)


def _gibibytes(seen: Seen, expected: Seen) -> bool:
    """Both bandwidths in GiB/s (2**30 bytes), where GB/s (10**9) was asked: each 10**9 / 2**30 of the right."""
    ratio = 1e9 / 2**30
    return _ratios_are(seen, 0, _right(0), [ratio] * 3) and _ratios_are(seen, 1, _right(1), [ratio] * 3)


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
    hint=(
        "A bandwidth counts bytes: an element of bfloat16 is 2 bytes, of float64 8. In a ring each rank sends "
        "(n-1)/n of the message to reduce-scatter it, and (n-1)/n again to all-gather the sums."
    ),
    setup=_busbw_setup,
    observe=_busbw_observe,
    expected=_busbw_expected,
    mistakes=(
        Mistake(
            "00-busbw-four-bytes",
            "right for float32 only: the answer counts 4 bytes per element, but a bfloat16 element is 2 bytes "
            "and a float64 one 8. tensor.element_size() says how many",
            _four_bytes,
            hint=(
                "Multiply numel() by tensor.element_size(), the bytes of one element of the tensor's own "
                "dtype."
            ),
        ),
        Mistake(
            "00-busbw-elements",
            "algbw is the right one divided by each message's element size (2, 4, 8): it counts elements, "
            "not bytes; numel() * element_size() is the message in bytes",
            _counted_elements,
            hint="Turn elements into bytes: nbytes = tensor.numel() * tensor.element_size().",
        ),
        Mistake(
            "00-busbw-no-factor",
            "busbw equals algbw at every world: it lacks the ring's factor 2(n-1)/n (1 at 2 ranks only, "
            "which is why the checker asks at 3, 4 and 8)",
            _no_factor,
            hint=(
                "Multiply algbw by 2 * (world - 1) / world: the ring's reduce-scatter and its all-gather each "
                "send (world - 1) / world of the message."
            ),
        ),
        Mistake(
            "00-busbw-half-ring",
            "busbw is half the right one: (n-1)/n counts the reduce-scatter alone; the all-gather sends "
            "(n-1)/n again, 2(n-1)/n in all",
            _half_ring,
            hint="Count both halves of the ring: busbw = algbw * 2 * (world - 1) / world.",
        ),
        Mistake(
            "00-busbw-gibibytes",
            "both bandwidths are 0.931 of the right ones (10**9 / 2**30): they are in GiB/s, 2**30 bytes a "
            "second, where the task asks GB/s, 10**9 bytes a second, the unit nccl-tests reports in",
            _gibibytes,
            hint="Divide bytes per second by 1e9 (GB, as link speeds are counted), not by 2**30 (GiB, as "
            "memory sizes are).",
        ),
    ),
)

EXERCISES = (SUM, BUSBW)
