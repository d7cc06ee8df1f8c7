"""Notebook 02's exercises: the loss you log is the big batch's (all ranks' samples), logged once; the
learning rate that goes with the global batch (the linear rule); and the job's throughput from each rank's
own clock (a synchronous step lasts the slowest rank's).

Probe inputs make each mistake leave its own mark. In 02-loss-mean rank r holds r + 2 per-sample losses,
each worth r + 1: the ranks' counts differ, so the mean of all samples, the mean of the ranks' means, the
sum divided by the world size and the ranks' own means differ (on some rank at least: with an odd
world the middle rank's own mean equals the mean of means). `print` is recorded
on each rank, so the checker sees who logged. In 02-lr-scale the base learning rate was tuned at a batch
unlike the batch per rank, so "lr times world size" and the rule itself give different answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddp_helpers.chapters.ch01_first_program.ch01_exercises import recording_print
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, close


def _number(value: Any) -> float | None:
    """A number the answer bound (a one-element tensor too) as a float; None for anything else."""
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _all_close(seen: Seen, name: str, values: list[float] | float) -> bool:
    """Every rank's `name` is its value in `values` (one for all, or one per rank)."""
    wanted = values if isinstance(values, list) else [values] * len(seen)
    return all(s.get(name) is not None and close(s[name], v) for s, v in zip(seen, wanted, strict=True))


# ------------------------------------------------------------------ 02-loss-mean


def _losses_of(rank: int) -> list[float]:
    """Rank r's per-sample losses: r + 2 samples (a count that differs per rank), each worth r + 1."""
    return [float(rank + 1)] * (rank + 2)


def _loss_setup(ctx: Context) -> dict[str, Any]:
    import torch

    printed: list[str] = []
    losses = torch.tensor(_losses_of(ctx.rank), dtype=torch.float64, device=ctx.device)
    return {"losses": losses, "print": recording_print(printed), "_printed": printed}


def _loss_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return {"mean_loss": _number(ns.get("mean_loss")), "printed": len(ns.get("_printed", []))}


def _all_losses(world: int) -> list[float]:
    return [v for r in range(world) for v in _losses_of(r)]


def _loss_expected(world: int) -> Seen:
    every = _all_losses(world)
    mean = sum(every) / len(every)
    return [{"mean_loss": mean, "printed": 1 if r == 0 else 0} for r in range(world)]


def _own_means(world: int) -> list[float]:
    return [sum(_losses_of(r)) / len(_losses_of(r)) for r in range(world)]


def _mean_loss_is(value: Callable[[int], list[float] | float]) -> Callable[[Seen, Seen], bool]:
    """A signature: more than one rank, and every rank's mean_loss is value(world) (one, or one per rank)."""
    return lambda seen, expected: len(seen) > 1 and _all_close(seen, "mean_loss", value(len(seen)))


LOSS_MEAN = Exercise(
    id="02-loss-mean",
    notebook="02",
    title="Log the loss of every rank's samples, once",
    task=(
        "Each rank holds `losses`, the per-sample losses of its own batch; the ranks' batches are of "
        "different sizes. Set `mean_loss` (a float, the same on every rank) to the mean over every sample "
        "of every rank, then let rank 0 alone `print` it."
    ),
    given=(
        "`losses` (float64: rank r holds r + 2 samples, each worth r + 1), `dist`, `rank`, `device`; "
        "`print` is recorded, so the checker sees which ranks printed"
    ),
    starter=(
        "# TODO: this rank's sum of losses and sample count, summed over every rank\n"
        "mean_loss = ...  # TODO: the mean over every sample of every rank, a float\n"
        'print(f"loss {mean_loss}")  # TODO: one line in the log, not one per rank\n'
    ),
    reference=(
        "stats = torch.tensor([losses.sum().item(), losses.numel()], dtype=torch.float64, device=device)\n"
        "dist.all_reduce(stats)  # SUM over the ranks: the sum of all losses, the count of all samples\n"
        "mean_loss = (stats[0] / stats[1]).item()  # every sample weighs the same, whatever its rank\n"
        "if rank == 0:  # one log line\n"
        '    print(f"loss {mean_loss:.4f}")\n'
    ),
    hint="A mean of the ranks' means weighs a small batch like a big one. All-reduce (SUM) two numbers "
    "per rank, its sum of losses and its count, and divide the two totals. Then one rank prints.",
    setup=_loss_setup,
    observe=_loss_observe,
    expected=_loss_expected,
    mistakes=(
        Mistake(
            "02-loss-mean-own-mean",
            "each rank's mean_loss is the mean of its own samples only: nothing was all-reduced, so rank 0 "
            "logs a loss of 1/N of the data",
            _mean_loss_is(_own_means),
            hint="All-reduce (SUM) a tensor of two numbers per rank, its losses' sum and its sample count, "
            "then divide the first total by the second.",
        ),
        Mistake(
            "02-loss-mean-mean-of-means",
            "mean_loss is the mean of the ranks' means: with batches of different sizes that weighs each "
            "rank alike, not each sample. All-reduce the sum and the count, then divide",
            _mean_loss_is(lambda world: sum(_own_means(world)) / world),
            hint="All-reduce each rank's sum of losses and its count of samples, in place of its mean; then "
            "divide the two totals.",
        ),
        Mistake(
            "02-loss-mean-divided-by-world",
            "mean_loss is the all-reduced sum divided by the world size: that is a mean per rank, not per "
            "sample. Divide by the all-reduced count of samples",
            _mean_loss_is(lambda world: sum(_all_losses(world)) / world),
            hint="Divide the all-reduced sum of losses by the all-reduced count of samples (losses.numel(), "
            "summed over the ranks), in place of world_size.",
        ),
        Mistake(
            "02-loss-mean-not-divided",
            "mean_loss is the sum of the losses, not their mean: divide the summed losses by the summed count",
            lambda seen, expected: _all_close(seen, "mean_loss", sum(_all_losses(len(seen)))),
            hint="Divide the summed losses by the summed count of samples: all-reduce the count beside the "
            "sum.",
        ),
        Mistake(
            "02-loss-mean-every-rank-prints",
            "every rank printed: the log holds N copies of one line. Print from rank 0 only",
            lambda seen, expected: len(seen) > 1 and all(s.get("printed") for s in seen),
            hint="Keep the all-reduce on every rank, and put the print alone under `if rank == 0:`.",
        ),
        Mistake(
            "02-loss-mean-not-printed",
            "rank 0 printed nothing: the log line is missing",
            lambda seen, expected: not seen[0].get("printed") and not seen[0].get("error"),
            hint="After the all-reduce that every rank runs, let rank 0 print: `if rank == 0: print(...)`.",
        ),
    ),
    covers=("loss-mean", "rank0-logs"),
)

# ------------------------------------------------------------------ 02-lr-scale
BASE_LR = 0.1  # Goyal et al.'s reference point: lr 0.1 for a batch of 256 (SGD)
BASE_BATCH = 256
BATCH_PER_RANK = 96  # no world size of 1 to 8 makes 96 x N = 256, and "lr x world size" is not the rule


def _lr_setup(ctx: Context) -> dict[str, Any]:
    import torch

    model = torch.nn.Linear(4, 1, bias=False, dtype=torch.float64).to(ctx.device)
    return {"model": model, "base_lr": BASE_LR, "base_batch": BASE_BATCH, "batch_size": BATCH_PER_RANK}


def _lr_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import torch

    optimizer = ns.get("optimizer")
    used = optimizer.param_groups[0]["lr"] if isinstance(optimizer, torch.optim.Optimizer) else None
    return {
        "global_batch": _number(ns.get("global_batch")),
        "lr": _number(ns.get("lr")),
        "optimizer_lr": _number(used),
    }


def _lr_expected(world: int) -> Seen:
    global_batch = BATCH_PER_RANK * world
    lr = BASE_LR * global_batch / BASE_BATCH
    return [{"global_batch": float(global_batch), "lr": lr, "optimizer_lr": lr} for _ in range(world)]


def _optimizer_lr_is(seen: Seen, lr: float) -> bool:
    return _all_close(seen, "optimizer_lr", lr)


LR_SCALE = Exercise(
    id="02-lr-scale",
    notebook="02",
    title="The learning rate for the global batch: the linear rule",
    task=(
        "`base_lr` was tuned for one process at a batch of `base_batch`. Each DDP rank now takes "
        "`batch_size` samples per step. Set `global_batch`, the samples one DDP step trains on, and `lr`, "
        "`base_lr` scaled by the linear rule; the optimizer line then uses it."
    ),
    given="`base_lr` (0.1), `base_batch` (256), `batch_size` (96 per rank), `world_size`, `model`",
    starter=(
        "global_batch = ...  # TODO: the samples one step trains on, over all ranks\n"
        "lr = ...  # TODO: base_lr, scaled by the linear rule\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)\n"
    ),
    reference=(
        "global_batch = batch_size * world_size  # each rank its own batch_size samples\n"
        "lr = base_lr * global_batch / base_batch  # linear rule: the lr grows as the batch does\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)\n"
    ),
    hint="The rule scales the lr by how much bigger the global batch is than the batch base_lr was tuned at. "
    "The global batch counts every rank's samples.",
    setup=_lr_setup,
    observe=_lr_observe,
    expected=_lr_expected,
    mistakes=(
        Mistake(
            "02-lr-scale-not-scaled",
            "the optimizer runs at base_lr: the global batch is not the one base_lr was tuned at, so the "
            "lr must change with it",
            lambda seen, expected: _optimizer_lr_is(seen, BASE_LR),
            hint="Scale the lr with the batch: lr = base_lr * global_batch / base_batch, with global_batch = "
            "batch_size * world_size.",
        ),
        Mistake(
            "02-lr-scale-per-rank-batch",
            "the lr was scaled by one rank's batch only: the global batch is batch_size x world_size, "
            "every rank's samples",
            lambda seen, expected: (
                len(seen) > 1 and _optimizer_lr_is(seen, BASE_LR * BATCH_PER_RANK / BASE_BATCH)
            ),
            hint="Use the global batch in the rule, batch_size * world_size: lr = base_lr * global_batch / "
            "base_batch.",
        ),
        Mistake(
            "02-lr-scale-inverted",
            "the lr shrank as the batch grew: the linear rule multiplies base_lr by global_batch / "
            "base_batch, not by its inverse",
            lambda seen, expected: _optimizer_lr_is(
                seen, BASE_LR * BASE_BATCH / (BATCH_PER_RANK * len(seen))
            ),
            hint="Put the global batch on top: lr = base_lr * global_batch / base_batch.",
        ),
        Mistake(
            "02-lr-scale-times-world",
            "the lr is base_lr x world_size: that is the rule only when each rank's batch equals the batch "
            "base_lr was tuned at; here it does not. Scale by global_batch / base_batch",
            lambda seen, expected: len(seen) > 1 and _optimizer_lr_is(seen, BASE_LR * len(seen)),
            hint="Scale by global_batch / base_batch: lr = base_lr * batch_size * world_size / base_batch.",
        ),
        Mistake(
            "02-lr-scale-square-root",
            "the lr follows the square-root rule, base_lr x sqrt(global_batch / base_batch), which is often "
            "used with Adam; the task asks for the linear rule that goes with SGD (Goyal et al.)",
            lambda seen, expected: _optimizer_lr_is(
                seen, BASE_LR * (BATCH_PER_RANK * len(seen) / BASE_BATCH) ** 0.5
            ),
            hint="Scale by the ratio itself, not its square root: lr = base_lr * global_batch / base_batch.",
        ),
    ),
    covers=("lr-scaled",),
)

# ------------------------------------------------------------------ 02-throughput
THROUGHPUT_BATCH = 32  # per rank
SINGLE_SAMPLES_PER_S = 200.0  # the one-process baseline at one device's batch


def _step_s_of(rank: int) -> float:
    """Rank r's own clock for one step: 0.1 s x (r + 1), so the slowest rank, the mean and each own differ."""
    return 0.1 * (rank + 1)


def _throughput_setup(ctx: Context) -> dict[str, Any]:
    return {
        "step_s": _step_s_of(ctx.rank),
        "batch_size": THROUGHPUT_BATCH,
        "single_samples_per_s": SINGLE_SAMPLES_PER_S,
    }


def _throughput_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return {"samples_per_s": _number(ns.get("samples_per_s")), "efficiency": _number(ns.get("efficiency"))}


def _job_samples_per_s(world: int, step_s: float) -> float:
    return THROUGHPUT_BATCH * world / step_s


def _throughput_expected(world: int) -> Seen:
    samples_per_s = _job_samples_per_s(world, max(_step_s_of(r) for r in range(world)))
    efficiency = samples_per_s / (world * SINGLE_SAMPLES_PER_S)
    return [{"samples_per_s": samples_per_s, "efficiency": efficiency} for _ in range(world)]


def _samples_per_s_is(value: Callable[[int], list[float] | float]) -> Callable[[Seen, Seen], bool]:
    """A signature: more than one rank, and every rank's samples_per_s is value(world) (one, or per rank)."""
    return lambda seen, expected: len(seen) > 1 and _all_close(seen, "samples_per_s", value(len(seen)))


def _efficiency_not_per_device(seen: Seen, expected: Seen) -> bool:
    right = expected[0]["samples_per_s"]
    return _samples_per_s_is(lambda world: right)(seen, expected) and _all_close(
        seen, "efficiency", right / SINGLE_SAMPLES_PER_S
    )


THROUGHPUT = Exercise(
    id="02-throughput",
    notebook="02",
    title="The job's samples per second, from each rank's own clock",
    task=(
        "Each rank timed its own step, `step_s`. Set `samples_per_s`, the whole job's samples per second "
        "(the same on every rank), and `efficiency`, that throughput against `world_size` single processes."
    ),
    given=(
        "`step_s` (this rank's seconds per step: rank r took 0.1 x (r + 1)), `batch_size` (32 per rank), "
        "`single_samples_per_s` (200, one process alone), `dist`, `rank`, `world_size`, `device`"
    ),
    starter=(
        "# TODO: the job's step time, from every rank's step_s\n"
        "samples_per_s = ...  # TODO: every rank's samples, per second of the job's step\n"
        "efficiency = ...  # TODO: against world_size single processes\n"
    ),
    reference=(
        "slowest = torch.tensor([step_s], dtype=torch.float64, device=device)\n"
        "dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step ends on every rank when the last one's does\n"
        "samples_per_s = batch_size * world_size / slowest.item()\n"
        "efficiency = samples_per_s / (world_size * single_samples_per_s)\n"
    ),
    hint="DDP's steps are synchronous: every rank waits in the all-reduce for the slowest, so the job's step "
    "lasts the longest step_s (all_reduce with ReduceOp.MAX). In that time every rank trains its batch.",
    setup=_throughput_setup,
    observe=_throughput_observe,
    expected=_throughput_expected,
    mistakes=(
        Mistake(
            "02-throughput-own-step",
            "each rank used its own step_s: the ranks disagree, and a fast rank counts time it spent waiting "
            "for the slowest as if it trained. All-reduce the step time with MAX",
            _samples_per_s_is(lambda world: [_job_samples_per_s(world, _step_s_of(r)) for r in range(world)]),
            hint="All-reduce step_s with op=dist.ReduceOp.MAX, and use that slowest step on every rank.",
        ),
        Mistake(
            "02-throughput-mean-step",
            "samples_per_s uses the mean step time: a synchronous step lasts as long as the slowest rank's. "
            "All-reduce with MAX, not a SUM divided by the world size",
            _samples_per_s_is(
                lambda world: _job_samples_per_s(world, sum(_step_s_of(r) for r in range(world)) / world)
            ),
            hint="Reduce step_s with op=dist.ReduceOp.MAX: the slowest rank's step is the job's.",
        ),
        Mistake(
            "02-throughput-one-rank",
            "samples_per_s counts one rank's batch: in each step every rank trains batch_size samples, so "
            "the job trains batch_size x world_size",
            _samples_per_s_is(lambda world: THROUGHPUT_BATCH / max(_step_s_of(r) for r in range(world))),
            hint="Count every rank's batch: the job trains batch_size * world_size samples per step.",
        ),
        Mistake(
            "02-throughput-efficiency-not-per-device",
            "efficiency compares the job with one single process: divide by world_size x "
            "single_samples_per_s, what world_size devices would do alone",
            _efficiency_not_per_device,
            hint="Divide by what world_size lone processes would do: efficiency = samples_per_s / (world_size "
            "* single_samples_per_s).",
        ),
    ),
)

EXERCISES = (LOSS_MEAN, LR_SCALE, THROUGHPUT)
