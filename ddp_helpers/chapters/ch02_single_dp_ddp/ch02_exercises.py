"""Notebook 02's exercises: the loss logged over every rank's samples, the linear lr rule, the job's throughput.

Probe inputs make each mistake leave its own mark: in 02-loss-mean the ranks' batch sizes differ, in
02-lr-scale the batch per rank is not the tuned one, in 02-throughput each rank's clock differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddp_helpers.chapters.ch01_first_program.ch01_exercises import recording_print
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, close, number


def _all_close(seen: Seen, name: str, values: list[float] | float) -> bool:
    """Every rank's `name` is its value in `values` (one for all, or one per rank)."""
    wanted = values if isinstance(values, list) else [values] * len(seen)
    return all(s.get(name) is not None and close(s[name], v) for s, v in zip(seen, wanted, strict=True))


def _is(name: str, value: Callable[[int], list[float] | float]) -> Callable[[Seen, Seen], bool]:
    """A signature: more than one rank, and every rank's `name` is value(world) (one, or one per rank)."""
    return lambda seen, expected: len(seen) > 1 and _all_close(seen, name, value(len(seen)))


# ------------------------------------------------------------------ 02-loss-mean
def _losses_of(rank: int) -> list[float]:
    """Rank r's per-sample losses: r + 2 samples (a count that differs per rank), each worth r + 1."""
    return [float(rank + 1)] * (rank + 2)


def _loss_setup(ctx: Context) -> dict[str, Any]:
    import torch

    printed: list[str] = []
    losses = torch.tensor(_losses_of(ctx.rank), dtype=torch.float64, device=ctx.device)
    return {"losses": losses, "print": recording_print(printed), "_printed": printed}


def _all_losses(world: int) -> list[float]:
    return [v for r in range(world) for v in _losses_of(r)]


def _loss_expected(world: int) -> Seen:
    every = _all_losses(world)
    return [{"mean_loss": sum(every) / len(every), "printed": 1 if r == 0 else 0} for r in range(world)]


def _own_means(world: int) -> list[float]:
    return [sum(_losses_of(r)) / len(_losses_of(r)) for r in range(world)]


LOSS_MEAN = Exercise(
    id="02-loss-mean",
    notebook="02",
    title="Log the loss of every rank's samples, once",
    task="Set `mean_loss` (a float, the same on every rank) to the mean over every sample of every rank; "
    "rank 0 alone prints it.",
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
    hint="All-reduce (SUM) each rank's sum of losses and its count, divide the totals, print on rank 0.",
    setup=_loss_setup,
    observe=lambda ns, ctx: {
        "mean_loss": number(ns.get("mean_loss")),
        "printed": len(ns.get("_printed", [])),
    },
    expected=_loss_expected,
    mistakes=(
        Mistake(
            "02-loss-mean-own-mean",
            "Each rank's mean_loss is its own samples' mean: nothing was all-reduced.",
            _is("mean_loss", _own_means),
            hint="All-reduce (SUM) each rank's sum of losses and count, then divide the totals.",
        ),
        Mistake(
            "02-loss-mean-mean-of-means",
            "mean_loss is the mean of the ranks' means: it weighs each rank alike, not each sample.",
            _is("mean_loss", lambda world: sum(_own_means(world)) / world),
            hint="All-reduce each rank's sum and count, not its mean; then divide the two totals.",
        ),
        Mistake(
            "02-loss-mean-divided-by-world",
            "mean_loss is the summed losses over the world size: a mean per rank, not per sample.",
            _is("mean_loss", lambda world: sum(_all_losses(world)) / world),
            hint="Divide by the all-reduced count of samples, not by world_size.",
        ),
        Mistake(
            "02-loss-mean-not-divided",
            "mean_loss is the sum of the losses, not their mean.",
            lambda seen, expected: _all_close(seen, "mean_loss", sum(_all_losses(len(seen)))),
            hint="Divide the summed losses by the summed count of samples.",
        ),
        Mistake(
            "02-loss-mean-every-rank-prints",
            "Every rank printed: the log holds N copies of one line.",
            lambda seen, expected: len(seen) > 1 and all(s.get("printed") for s in seen),
            hint="Keep the all-reduce on every rank; put only the print under `if rank == 0:`.",
        ),
        Mistake(
            "02-loss-mean-not-printed",
            "Rank 0 printed nothing.",
            lambda seen, expected: not seen[0].get("printed") and not seen[0].get("error"),
            hint="After the all-reduce, `if rank == 0: print(...)`.",
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
        "global_batch": number(ns.get("global_batch")),
        "lr": number(ns.get("lr")),
        "optimizer_lr": number(used),
    }


def _lr_expected(world: int) -> Seen:
    global_batch = BATCH_PER_RANK * world
    lr = BASE_LR * global_batch / BASE_BATCH
    return [{"global_batch": float(global_batch), "lr": lr, "optimizer_lr": lr} for _ in range(world)]


def _lr_is(lr: Callable[[int], float]) -> Callable[[Seen, Seen], bool]:
    return lambda seen, expected: _all_close(seen, "optimizer_lr", lr(len(seen)))


LR_SCALE = Exercise(
    id="02-lr-scale",
    notebook="02",
    title="The learning rate for the global batch: the linear rule",
    task="Set `global_batch` (the samples one DDP step trains on) and `lr`, `base_lr` scaled by the linear rule.",
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
    hint="Scale base_lr by global_batch / base_batch; the global batch counts every rank's samples.",
    setup=_lr_setup,
    observe=_lr_observe,
    expected=_lr_expected,
    mistakes=(
        Mistake(
            "02-lr-scale-not-scaled",
            "The optimizer runs at base_lr, tuned for another batch.",
            _lr_is(lambda world: BASE_LR),
            hint="lr = base_lr * global_batch / base_batch, with global_batch = batch_size * world_size.",
        ),
        Mistake(
            "02-lr-scale-per-rank-batch",
            "The lr was scaled by one rank's batch, not the global batch of every rank's samples.",
            lambda seen, expected: (
                len(seen) > 1 and _lr_is(lambda w: BASE_LR * BATCH_PER_RANK / BASE_BATCH)(seen, expected)
            ),
            hint="Use global_batch = batch_size * world_size in the rule.",
        ),
        Mistake(
            "02-lr-scale-inverted",
            "The lr shrank as the batch grew: the ratio is upside down.",
            _lr_is(lambda world: BASE_LR * BASE_BATCH / (BATCH_PER_RANK * world)),
            hint="Put the global batch on top: lr = base_lr * global_batch / base_batch.",
        ),
        Mistake(
            "02-lr-scale-times-world",
            "The lr is base_lr x world_size: right only when each rank's batch is base_batch, not here.",
            lambda seen, expected: len(seen) > 1 and _lr_is(lambda world: BASE_LR * world)(seen, expected),
            hint="Scale by global_batch / base_batch.",
        ),
        Mistake(
            "02-lr-scale-square-root",
            "The lr follows the square-root rule (used with Adam); SGD's is the linear rule (Goyal et al.).",
            _lr_is(lambda world: BASE_LR * (BATCH_PER_RANK * world / BASE_BATCH) ** 0.5),
            hint="Scale by the ratio itself, not its square root.",
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


def _job_samples_per_s(world: int, step_s: float) -> float:
    return THROUGHPUT_BATCH * world / step_s


def _throughput_expected(world: int) -> Seen:
    samples_per_s = _job_samples_per_s(world, max(_step_s_of(r) for r in range(world)))
    efficiency = samples_per_s / (world * SINGLE_SAMPLES_PER_S)
    return [{"samples_per_s": samples_per_s, "efficiency": efficiency} for _ in range(world)]


def _efficiency_not_per_device(seen: Seen, expected: Seen) -> bool:
    right = expected[0]["samples_per_s"]
    return _is("samples_per_s", lambda world: right)(seen, expected) and _all_close(
        seen, "efficiency", right / SINGLE_SAMPLES_PER_S
    )


THROUGHPUT = Exercise(
    id="02-throughput",
    notebook="02",
    title="The job's samples per second, from each rank's own clock",
    task="Set `samples_per_s`, the job's samples per second (the same on every rank), and `efficiency`, "
    "against `world_size` single processes.",
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
    hint="A synchronous step lasts the slowest rank's step_s (all_reduce with ReduceOp.MAX); every rank "
    "trains its batch in it.",
    setup=lambda ctx: {
        "step_s": _step_s_of(ctx.rank),
        "batch_size": THROUGHPUT_BATCH,
        "single_samples_per_s": SINGLE_SAMPLES_PER_S,
    },
    observe=lambda ns, ctx: {
        "samples_per_s": number(ns.get("samples_per_s")),
        "efficiency": number(ns.get("efficiency")),
    },
    expected=_throughput_expected,
    mistakes=(
        Mistake(
            "02-throughput-own-step",
            "Each rank used its own step_s: the ranks disagree, and a fast rank counts its wait as training.",
            _is("samples_per_s", lambda w: [_job_samples_per_s(w, _step_s_of(r)) for r in range(w)]),
            hint="All-reduce step_s with op=dist.ReduceOp.MAX and use that on every rank.",
        ),
        Mistake(
            "02-throughput-mean-step",
            "samples_per_s uses the mean step time; a synchronous step lasts the slowest rank's.",
            _is("samples_per_s", lambda w: _job_samples_per_s(w, sum(_step_s_of(r) for r in range(w)) / w)),
            hint="Reduce step_s with op=dist.ReduceOp.MAX, not a SUM over the world size.",
        ),
        Mistake(
            "02-throughput-one-rank",
            "samples_per_s counts one rank's batch; each step trains every rank's.",
            _is("samples_per_s", lambda w: THROUGHPUT_BATCH / max(_step_s_of(r) for r in range(w))),
            hint="Count batch_size * world_size samples per step.",
        ),
        Mistake(
            "02-throughput-efficiency-not-per-device",
            "efficiency compares the job with one single process, not with world_size of them.",
            _efficiency_not_per_device,
            hint="Divide by world_size * single_samples_per_s.",
        ),
    ),
)

EXERCISES = (LOSS_MEAN, LR_SCALE, THROUGHPUT)
