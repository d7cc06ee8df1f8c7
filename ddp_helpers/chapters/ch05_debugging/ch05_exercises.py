"""Notebook 05's exercises: skip a step on every rank when any rank's loss is not finite (05-nan-skip),
and find the rank whose loss went bad first (05-first-bad). 05-nan-skip's one-hot samples of 10**step make
the weights say which steps were taken; 05-first-bad's losses make each wrong way of looking differ.
"""

from __future__ import annotations

import math
from typing import Any

from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, field_of

# ------------------------------------------------------------------ 05-nan-skip
WIDTH = 8  # one-hot samples: one coordinate per rank, up to 8 ranks
STEPS = 5
LAST_RANK_NAN = 1  # the step at which the last rank's loss is NaN
RANK0_BAD = 3  # the step at which rank 0's loss is NaN
# the step at which the last rank's sample is infinite (its loss -inf, not NaN): the last step, since a step
# taken with an infinite gradient leaves weights whose next losses are NaN (0 * inf), which would hide it
LAST_RANK_INF = 4


def _skip_setup(ctx: Context) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    width = max(WIDTH, ctx.world_size)
    model = torch.nn.Linear(width, 1, bias=False, dtype=torch.float64).to(ctx.device)
    torch.nn.init.zeros_(model.weight)
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=1.0)
    batches = []
    for step in range(STEPS):
        x = torch.zeros(1, width, dtype=torch.float64, device=ctx.device)
        x[0, ctx.rank] = 10.0**step
        last = ctx.rank == ctx.world_size - 1
        if last and step == LAST_RANK_INF:
            x[0, ctx.rank] = float("inf")  # the weight there is not 0 by then: the loss is -inf
        if (last and step == LAST_RANK_NAN) or (ctx.rank == 0 and step == RANK0_BAD):
            x[0, ctx.rank] = float("nan")  # this rank's loss is NaN at this step
        batches.append(x)
    probe: dict[str, Any] = {"forwards": 0, "steps_taken": []}

    def count_forward(module: Any, args: Any) -> None:
        probe["forwards"] += 1

    def record_step(opt: Any, args: Any, kwargs: Any) -> None:
        probe["steps_taken"].append(probe["forwards"] - 1)  # the batch whose forward came last

    model.register_forward_pre_hook(count_forward)
    optimizer.register_step_post_hook(record_step)
    return {
        "ddp_model": ddp_model,
        "optimizer": optimizer,
        "batches": batches,
        "_probe": probe,
        "_model": model,
    }


def _skip_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    weight = ns["_model"].weight.detach().cpu().flatten().tolist()
    return {
        "steps_taken": list(ns["_probe"]["steps_taken"]),
        "weight": [round(v, 12) for v in weight],  # NaN and inf stay themselves: the verdict shows them
    }


def _skip_expected(world: int) -> Seen:
    width = max(WIDTH, world)
    taken = [s for s in range(STEPS) if s not in (LAST_RANK_INF, RANK0_BAD, LAST_RANK_NAN)]
    # lr 1 times the average of the ranks' one-hots, over the steps taken
    weight = [-sum(10.0**s for s in taken) / world if i < world else 0.0 for i in range(width)]
    return [{"steps_taken": taken, "weight": weight} for _ in range(world)]


def _steps(seen: Seen) -> list[Any]:
    return field_of(seen, "steps_taken")


def _ranks_disagree(seen: Seen, expected: Seen) -> bool:
    steps = _steps(seen)
    return len(seen) > 1 and all(isinstance(s, list) for s in steps) and any(s != steps[0] for s in steps)


def _followed_rank0(seen: Seen, expected: Seen) -> bool:
    steps = _steps(seen)
    return len(seen) > 1 and all(
        isinstance(s, list) and LAST_RANK_NAN in s and RANK0_BAD not in s for s in steps
    )


def _nan_only(seen: Seen, expected: Seen) -> bool:
    steps = _steps(seen)
    return all(
        isinstance(s, list) and LAST_RANK_INF in s and RANK0_BAD not in s and LAST_RANK_NAN not in s
        for s in steps
    )


def _never_skipped(seen: Seen, expected: Seen) -> bool:
    return all(s == list(range(STEPS)) for s in _steps(seen))


def _stale_gradients(seen: Seen, expected: Seen) -> bool:
    return all(
        s.get("steps_taken") == e["steps_taken"] and not all(math.isfinite(v) for v in s.get("weight") or [])
        for s, e in zip(seen, expected, strict=True)
    )


NAN_SKIP = Exercise(
    id="05-nan-skip",
    notebook="05",
    title="Skip a step on every rank when any rank's loss is not finite",
    task="Skip `optimizer.step()` on EVERY rank when ANY rank's loss is not finite; every rank still "
    "runs `backward()`.",
    starter=(
        "for x in batches:\n"
        "    optimizer.zero_grad()\n"
        "    loss = ddp_model(x).sum()\n"
        "    loss.backward()  # every rank, every step: DDP's all-reduce is a collective\n"
        "    bad = ...  # TODO: 1.0 if this rank's loss is not finite, else 0.0: a tensor on `device`\n"
        "    ...  # TODO: one collective, so that every rank sees whether ANY rank's loss was not finite\n"
        "    if ...:  # TODO: step only when no rank's loss was bad\n"
        "        optimizer.step()\n"
    ),
    reference=(
        "for x in batches:\n"
        "    optimizer.zero_grad()  # also after a skipped step, whose gradients are NaN\n"
        "    loss = ddp_model(x).sum()\n"
        "    loss.backward()  # every rank, every step: DDP's all-reduce is a collective\n"
        "    bad = torch.tensor(0.0 if torch.isfinite(loss) else 1.0, device=device)  # this rank's flag\n"
        "    dist.all_reduce(bad)  # SUM over the ranks: how many losses were not finite\n"
        "    if bad.item() == 0:  # the same answer on every rank: all step, or none\n"
        "        optimizer.step()\n"
    ),
    hint="All-reduce a 0/1 flag tensor (SUM or MAX) and decide from the reduced value on every rank.",
    setup=_skip_setup,
    observe=_skip_observe,
    expected=_skip_expected,
    mistakes=(
        Mistake(
            "05-nan-skip-local-only",
            "The ranks stepped at different steps: each decided from its own loss, and the replicas parted.",
            _ranks_disagree,
            hint="All-reduce the flag so that every rank decides from the same value.",
        ),
        Mistake(
            "05-nan-skip-rank0-only",
            "The ranks skipped only where rank 0's loss was NaN: they agreed on rank 0's flag alone.",
            _followed_rank0,
            hint="dist.all_reduce(bad), not a broadcast from rank 0: the bad loss may be on any rank.",
        ),
        Mistake(
            "05-nan-skip-nan-only",
            f"Step {LAST_RANK_INF}, where the last rank's loss was -inf, was taken: the flag tested for NaN only.",
            _nan_only,
            hint="Flag a loss for which torch.isfinite(loss) is False.",
        ),
        Mistake(
            "05-nan-skip-never-skipped",
            "Every rank took every step, the NaN ones too (nothing skipped, or a MIN or PRODUCT reduce).",
            _never_skipped,
            hint="Reduce with SUM or MAX and step only when the reduced flag is 0.",
        ),
        Mistake(
            "05-nan-skip-stale-grad",
            "The right steps were skipped, yet the weights are NaN: a skipped step's NaN gradients stayed.",
            _stale_gradients,
            hint="Call optimizer.zero_grad() first in every iteration, skipped ones too.",
        ),
    ),
    covers=("nan-skip-all",),
)

# ------------------------------------------------------------------ 05-first-bad
LOSS_STEPS = 12
# the first bad step is no rank's number (worlds up to 9 ranks), so (rank, step) never reads as (step, rank)
FIRST_BAD_STEP = 9


def losses_of(rank: int, world: int) -> list[float]:
    """Finite, but for the last rank's inf at step 9 and rank 0's inf at step 10 and NaN at step 11."""
    losses = [round(1.0 / (1 + step) + 0.01 * rank, 6) for step in range(LOSS_STEPS)]
    if rank == world - 1:
        losses[FIRST_BAD_STEP] = float("inf")
    if rank == 0:
        losses[FIRST_BAD_STEP + 1], losses[FIRST_BAD_STEP + 2] = float("inf"), float("nan")
    return losses


def _first_bad_setup(ctx: Context) -> dict[str, Any]:
    import math

    return {"losses": losses_of(ctx.rank, ctx.world_size), "math": math}


def _first_bad_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    found = ns.get("first_bad")
    if isinstance(found, tuple | list):
        found = [int(v) if isinstance(v, int | float) and v == v else v for v in found]
    elif found is not None:
        found = repr(found)
    return {"first_bad": found}


def _first_bad_expected(world: int) -> Seen:
    return [{"first_bad": [FIRST_BAD_STEP, world - 1]} for _ in range(world)]


def _own_view(seen: Seen, expected: Seen) -> bool:
    found = field_of(seen, "first_bad")
    return (
        len(seen) > 1
        and any(f != found[0] for f in found)
        and all(f is None or (isinstance(f, list) and f[1:] == [r]) for r, f in enumerate(found))
    )


def _rank0_alone(seen: Seen, expected: Seen) -> bool:
    found = field_of(seen, "first_bad")
    return len(seen) > 1 and found[0] == expected[0]["first_bad"] and all(f is None for f in found[1:])


FIRST_BAD = Exercise(
    id="05-first-bad",
    notebook="05",
    title="Find the rank whose loss went bad first",
    task="Bind `first_bad` on every rank to `(step, rank)` of the earliest non-finite loss (lowest rank on a "
    "tie), or `None`.",
    starter=(
        "histories = ...  # TODO: every rank's `losses`, in rank order, on every rank\n"
        "first_bad = ...  # TODO: (step, rank) of the earliest loss that is not finite, or None\n"
    ),
    reference=(
        "histories = [None] * world_size\n"
        "dist.all_gather_object(histories, losses)  # every rank gets every rank's list\n"
        "bad = [(step, r) for r, history in enumerate(histories)  # each rank's list\n"
        "       for step, loss in enumerate(history) if not math.isfinite(loss)]  # NaN and +-inf\n"
        "first_bad = min(bad) if bad else None  # the earliest step first; then the lowest rank\n"
    ),
    hint="Gather every rank's list on every rank, test with math.isfinite, take the smallest (step, rank).",
    setup=_first_bad_setup,
    observe=_first_bad_observe,
    expected=_first_bad_expected,
    mistakes=(
        Mistake(
            "05-first-bad-own-view",
            "The ranks disagree, each naming itself or nothing: each looked at its own losses only.",
            _own_view,
            hint="dist.all_gather_object(histories, losses), then search every list.",
        ),
        Mistake(
            "05-first-bad-rank0-only",
            "Rank 0 found it; the others have nothing: the lists were gathered to rank 0 alone.",
            _rank0_alone,
            hint="Use dist.all_gather_object, so that every rank gets every list.",
        ),
        Mistake(
            "05-first-bad-nan-only",
            f"Every rank names rank 0 at step {FIRST_BAD_STEP + 2}, its NaN: the earlier inf went unnoticed.",
            lambda seen, expected: all(f == [FIRST_BAD_STEP + 2, 0] for f in field_of(seen, "first_bad")),
            hint="Test each loss with math.isfinite(loss).",
        ),
        Mistake(
            "05-first-bad-rank-order",
            f"Every rank names rank 0 at step {FIRST_BAD_STEP + 1}: the first bad loss in rank order, not in time.",
            lambda seen, expected: (
                len(seen) > 1 and all(f == [FIRST_BAD_STEP + 1, 0] for f in field_of(seen, "first_bad"))
            ),
            hint="Collect every bad loss as a (step, rank) pair and take the smallest.",
        ),
        Mistake(
            "05-first-bad-swapped",
            "The right loss, but bound as (rank, step), not (step, rank).",
            lambda seen, expected: all(
                f == list(reversed(e["first_bad"]))
                for f, e in zip(field_of(seen, "first_bad"), expected, strict=True)
            ),
            hint="first_bad = (step, rank).",
        ),
    ),
)

EXERCISES = (NAN_SKIP, FIRST_BAD)
