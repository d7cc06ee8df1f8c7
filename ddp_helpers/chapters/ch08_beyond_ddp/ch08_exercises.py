"""Notebook 08's exercises: what one rank holds under ZeRO-1 and under FSDP2, in bytes.

One model, Linear 4 -> 6 -> 10 -> 3, whose rows 2 and 3 ranks do not all divide: shards come out uneven.
fp32 Adam: 4 bytes of weight, 4 of gradient, 8 of moments per element (Adam's `step` left out).
"""

from __future__ import annotations

import math
from typing import Any

from ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_calculator import (
    padded_numel,
    shard_numel,
    zero1_owners,
)
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen

SHAPES = [(6, 4), (6,), (10, 6), (10,), (3, 10), (3,)]  # Linear(4, 6), Linear(6, 10), Linear(10, 3)
NUMEL = [math.prod(shape) for shape in SHAPES]
TOTAL = sum(NUMEL)


def zero1_owned(world: int, order: Any = None, weigh: Any = None) -> list[list[int]]:
    return [sorted(owned) for owned in zero1_owners(NUMEL, world, order, weigh)]


# ------------------------------------------------------------------ 08-zero1
def _zero1_setup(ctx: Context) -> dict[str, Any]:
    return {"shapes": [tuple(s) for s in SHAPES]}


def _zero1_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    owned = ns.get("owned")
    try:
        owned = sorted(int(i) for i in owned) if owned is not None else None
    except TypeError:
        owned = None
    held = ns.get("zero1_bytes")
    return {"owned": owned, "zero1_bytes": float(held) if isinstance(held, int | float) else None}


def _zero1_expected(world: int) -> Seen:
    owned = zero1_owned(world)
    mine = [sum(NUMEL[i] for i in o) for o in owned]
    # full weights and full gradients on every rank; Adam's two moments only for the tensors it owns
    return [{"owned": owned[r], "zero1_bytes": float(8 * TOTAL + 8 * mine[r])} for r in range(world)]


def _owned_as(deal: Any) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        wanted = deal(world)
        return world > 1 and all(s.get("owned") == wanted[r] for r, s in enumerate(seen))

    return matches


def _bytes_as(formula: Any) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        owned = zero1_owned(world)
        return world > 1 and all(
            s.get("zero1_bytes") is not None
            and math.isclose(s["zero1_bytes"], formula(sum(NUMEL[i] for i in owned[r]), world))
            for r, s in enumerate(seen)
        )

    return matches


ZERO1 = Exercise(
    id="08-zero1",
    notebook="08",
    title="ZeRO-1: which Adam states this rank keeps, and its bytes",
    task=(
        "Compute `owned`, the indices into `shapes` whose Adam state this rank keeps under "
        "`ZeroRedundancyOptimizer`, and `zero1_bytes`, this rank's bytes of fp32 weights, gradients and moments."
    ),
    starter=(
        "import math\n"
        "\n"
        "numel = [math.prod(shape) for shape in shapes]\n"
        "total = sum(numel)\n"
        "owned = ...  # TODO: the indices of the parameters this rank keeps Adam's state for\n"
        "zero1_bytes = ...  # TODO: weights, gradients and Adam's moments on this rank, in bytes\n"
    ),
    reference=(
        "import math\n"
        "\n"
        "numel = [math.prod(shape) for shape in shapes]\n"
        "total = sum(numel)\n"
        "load = [0] * world_size  # elements dealt to each rank so far\n"
        "owner = {}\n"
        "for i in sorted(range(len(numel)), key=lambda i: numel[i], reverse=True):  # largest first\n"
        "    owner[i] = load.index(min(load))  # the emptiest rank, the lowest on a tie\n"
        "    load[owner[i]] += numel[i]\n"
        "owned = sorted(i for i, r in owner.items() if r == rank)  # this rank's share\n"
        "mine = sum(numel[i] for i in owned)\n"
        "zero1_bytes = 4 * total + 4 * total + 8 * mine  # full weights, full grads, moments of its own\n"
    ),
    hint="ZeRO-1 splits only Adam's moments: every rank keeps all weights and gradients; deal by size.",
    setup=_zero1_setup,
    observe=_zero1_observe,
    expected=_zero1_expected,
    mistakes=(
        Mistake(
            "08-zero1-round-robin",
            "the parameters were dealt by index, one rank after the other, not by size.",
            _owned_as(lambda world: [list(range(r, len(NUMEL), world)) for r in range(world)]),
            hint="Deal the indices sorted by numel, largest first, each to the emptiest rank.",
        ),
        Mistake(
            "08-zero1-dealt-by-count",
            "each parameter went to the rank with the fewest tensors; ZeroRedundancyOptimizer balances elements.",
            _owned_as(lambda world: zero1_owned(world, weigh=lambda i: 1)),
            hint="Add numel[i], not 1, to the load of the rank that receives parameter i.",
        ),
        Mistake(
            "08-zero1-not-largest-first",
            "the parameters went to the emptiest rank in registration order, not largest first.",
            _owned_as(lambda world: zero1_owned(world, order=range(len(NUMEL)))),
            hint="Deal in sorted(range(len(numel)), key=lambda i: numel[i], reverse=True).",
        ),
        Mistake(
            "08-zero1-even-split",
            "you counted exactly 1/N of Adam's state per rank; ZeroRedundancyOptimizer cannot split a tensor.",
            _bytes_as(lambda mine, world: 8 * TOTAL + 8 * TOTAL / world),
            hint="Count the moments of the parameters in `owned` only.",
        ),
        Mistake(
            "08-zero1-sharded-grads",
            "you counted only this rank's share of the gradients (ZeRO-2) or of the weights; "
            "ZeRO-1 keeps both whole.",
            _bytes_as(lambda mine, world: 4 * TOTAL + 12 * mine),
            hint="Count every weight and gradient in full, and the moments of `owned` only.",
        ),
        Mistake(
            "08-zero1-step-counted",
            "the bytes are 4 (or 8) per owned tensor too many: Adam's `step`, which the task leaves out.",
            lambda seen, expected: all(
                s.get("zero1_bytes") is not None
                and s.get("owned") == e["owned"]
                and any(
                    math.isclose(s["zero1_bytes"], e["zero1_bytes"] + k * len(e["owned"])) for k in (4, 8)
                )
                for s, e in zip(seen, expected, strict=True)
            ),
            hint="Count Adam's two moments alone, 8 bytes per element.",
        ),
        Mistake(
            "08-zero1-all-sharded",
            "you split weights, gradients and Adam's state alike: that is ZeRO-3 (FSDP).",
            lambda seen, expected: (
                _bytes_as(lambda mine, world: 16 * mine)(seen, expected)
                or _bytes_as(lambda mine, world: 16 * TOTAL / world)(seen, expected)
            ),
            hint="Count weights and gradients whole, then 8 bytes per element of `owned`.",
        ),
    ),
    covers=(),
)


# ------------------------------------------------------------------ 08-fsdp2
_meshes: dict[tuple[str, int], Any] = {}  # one device mesh per world, for every check on these ranks


def _fsdp2_setup(ctx: Context) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:  # pragma: no cover - older torch
        from torch.distributed._composable.fsdp import fully_shard

    key = (ctx.device.type, ctx.world_size)
    if key not in _meshes:
        _meshes[key] = init_device_mesh(ctx.device.type, (ctx.world_size,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6),
        torch.nn.ReLU(),
        torch.nn.Linear(6, 10),
        torch.nn.ReLU(),
        torch.nn.Linear(10, 3),
    ).to(ctx.device)
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=_meshes[key])  # each Linear one unit: one all-gather each
    fully_shard(model, mesh=_meshes[key])
    return {"model": model}


def _fsdp2_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    out = {}
    for name in ("held_bytes", "gathered_bytes"):
        value = ns.get(name)
        out[name] = float(value) if isinstance(value, int | float) else None
    return out


def _fsdp2_expected(world: int) -> Seen:
    gathered = 4 * sum(padded_numel(shape, world) for shape in SHAPES)
    return [
        {
            "held_bytes": float(16 * sum(shard_numel(shape, r, world) for shape in SHAPES)),
            "gathered_bytes": float(gathered),
        }
        for r in range(world)
    ]


def _held_is(formula: Any) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        return world > 1 and all(
            s.get("held_bytes") is not None and math.isclose(s["held_bytes"], formula(r, world))
            for r, s in enumerate(seen)
        )

    return matches


def _flat_split(rank: int, world: int) -> list[float]:
    """What FSDP1 would hold: one flat parameter per unit split into equal parts, padded or not."""
    units = [[30, 70, 33], [TOTAL]]  # each Linear's weight and bias flattened together; or one unit
    out = []
    for sizes in units:
        per = [math.ceil(n / world) for n in sizes]
        out.append(16.0 * sum(per))
        out.append(16.0 * sum(max(0, min(p, n - rank * p)) for p, n in zip(per, sizes, strict=True)))
    return out


def _flat(seen: Seen, expected: Seen) -> bool:
    world = len(seen)
    return world > 1 and all(
        s.get("held_bytes") is not None
        and any(math.isclose(s["held_bytes"], v) for v in _flat_split(r, world))
        for r, s in enumerate(seen)
    )


def _own_shard_times_world(seen: Seen, expected: Seen) -> bool:
    world = len(seen)
    own = [4 * world * sum(shard_numel(shape, r, world) for shape in SHAPES) for r in range(world)]
    return (
        world > 1
        and own != [e["gathered_bytes"] for e in expected]
        and all(
            s.get("gathered_bytes") is not None and math.isclose(s["gathered_bytes"], own[r])
            for r, s in enumerate(seen)
        )
    )


def _not_padded(seen: Seen, expected: Seen) -> bool:
    return len(seen) > 1 and all(
        s.get("gathered_bytes") is not None and math.isclose(s["gathered_bytes"], 4 * TOTAL) for s in seen
    )


FSDP2 = Exercise(
    id="08-fsdp2",
    notebook="08",
    title="FSDP2: the bytes this rank holds, and what an all-gather moves",
    task=(
        "Compute `held_bytes`, this rank's bytes of fp32 weights, gradients and moments of its shards of "
        "`model`, and `gathered_bytes`, what the all-gathers of every full parameter move, padding included."
    ),
    starter=(
        "import math\n"
        "\n"
        "held_bytes = 0\n"
        "gathered_bytes = 0\n"
        "for p in model.parameters():\n"
        "    ...  # TODO: add this rank's bytes for p's shard, and the bytes of p's all-gather\n"
    ),
    reference=(
        "import math\n"
        "\n"
        "held_bytes = 0\n"
        "gathered_bytes = 0\n"
        "for p in model.parameters():\n"
        "    held_bytes += 16 * p.to_local().numel()  # this rank's rows: weight 4 + grad 4 + Adam 8 bytes\n"
        "    rows = math.ceil(p.shape[0] / world_size) * world_size  # dim 0 padded to a multiple of N\n"
        "    gathered_bytes += 4 * rows * math.prod(p.shape[1:])  # p.shape: the full parameter's\n"
    ),
    hint="`to_local()` is this rank's shard; each all-gather moves dim 0 padded to a multiple of N.",
    setup=_fsdp2_setup,
    observe=_fsdp2_observe,
    expected=_fsdp2_expected,
    mistakes=(
        Mistake(
            "08-fsdp2-global-numel",
            "every rank counted the whole model: a DTensor's numel() is the full parameter's.",
            _held_is(lambda rank, world: 16 * TOTAL),
            hint="Count p.to_local().numel(), 16 bytes per element.",
        ),
        Mistake(
            "08-fsdp2-even-split",
            "you counted exactly 1/N of the model per rank; FSDP2's shards of whole rows are uneven.",
            _held_is(lambda rank, world: 16 * TOTAL / world),
            hint="Add up each parameter's own shard, p.to_local().",
        ),
        Mistake(
            "08-fsdp2-step-counted",
            "each parameter counted 4 (or 8) bytes too many: Adam's `step`, which the task leaves out.",
            lambda seen, expected: all(
                s.get("held_bytes") is not None
                and any(math.isclose(s["held_bytes"], e["held_bytes"] + k * len(SHAPES)) for k in (4, 8))
                for s, e in zip(seen, expected, strict=True)
            ),
            hint="Count 16 bytes per element of each shard, nothing per tensor.",
        ),
        Mistake(
            "08-fsdp2-flat-split",
            "you split as FSDP1 does, one flat parameter cut into N equal parts; FSDP2 shards each parameter by rows.",
            _flat,
            hint="Take each parameter on its own: its shard is p.to_local().",
        ),
        Mistake(
            "08-fsdp2-own-shard-times-n",
            "the all-gather's bytes are this rank's shard times N, wrong on a rank with fewer rows.",
            _own_shard_times_world,
            hint="Count from the full shape: math.ceil(p.shape[0] / world_size) * world_size rows.",
        ),
        Mistake(
            "08-fsdp2-no-padding",
            "the all-gathers move more than the parameters' bytes: FSDP2 pads dim 0 to a multiple of N.",
            _not_padded,
            hint="Pad dim 0 up to math.ceil(p.shape[0] / world_size) * world_size rows.",
        ),
    ),
    covers=(),
)

EXERCISES = (ZERO1, FSDP2)
