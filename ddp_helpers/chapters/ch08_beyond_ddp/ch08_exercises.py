"""Notebook 08's exercises: what one rank holds under ZeRO-1 and under FSDP2, in bytes.

Both use one small model of three Linear layers, 4 -> 6 -> 10 -> 3, whose row counts (6, 10, 3) two
and three ranks do not all divide: FSDP2's shards come out uneven and its collectives padded, and
ZeroRedundancyOptimizer's deal of whole tensors differs from a round robin and from a deal in
registration order. fp32 Adam: 4 bytes of weight, 4 of gradient and 8 of Adam's two moments per
parameter (Adam's 4-byte `step` per tensor is left out). The expected values are the arithmetic of
the shapes; in 08-fsdp2 the answer reads the shards of a model that FSDP2 really sharded on the ranks.
"""

from __future__ import annotations

import math
from typing import Any

from ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_calculator import padded_numel, shard_numel
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen

SHAPES = [(6, 4), (6,), (10, 6), (10,), (3, 10), (3,)]  # Linear(4, 6), Linear(6, 10), Linear(10, 3)
NUMEL = [math.prod(shape) for shape in SHAPES]
TOTAL = sum(NUMEL)


def zero1_owned(world: int, order: Any = None) -> list[list[int]]:
    """ZeroRedundancyOptimizer's deal: the parameters largest first (a stable sort), each to the rank
    with the fewest elements so far, the lowest on a tie; `order` overrides the order of dealing."""
    order = sorted(range(len(NUMEL)), key=lambda i: NUMEL[i], reverse=True) if order is None else order
    load, owner = [0] * world, {}
    for i in order:
        owner[i] = load.index(min(load))
        load[owner[i]] += NUMEL[i]
    return [sorted(i for i in owner if owner[i] == r) for r in range(world)]


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


def _dealt_by_count(world: int) -> list[list[int]]:
    """Largest first, each to the rank with the fewest tensors so far: tensors counted, not elements."""
    order = sorted(range(len(NUMEL)), key=lambda i: NUMEL[i], reverse=True)
    count, owner = [0] * world, {}
    for i in order:
        owner[i] = count.index(min(count))
        count[owner[i]] += 1
    return [sorted(i for i in owner if owner[i] == r) for r in range(world)]


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
        "`ZeroRedundancyOptimizer` deals whole parameters to the ranks: largest first, each to the rank "
        "that holds the fewest elements so far (the lowest rank on a tie). Compute `owned`, the indices (into "
        "`shapes`) of the parameters whose Adam state this rank keeps, and `zero1_bytes`, the bytes this rank "
        "holds for fp32 weights, gradients and Adam's two moments under ZeRO-1 (leave out Adam's `step`)."
    ),
    given="`shapes` (the parameters' shapes, in registration order), `rank`, `world_size`",
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
    hint=(
        "ZeRO-1 partitions only the optimizer state: every rank still holds every weight (4 bytes each) and, "
        "after backward, every gradient (4 bytes each, DDP's all-reduce); Adam's exp_avg and exp_avg_sq (8 "
        "bytes per element) live only on the rank that owns the parameter. The deal goes by size, largest "
        "first, not by index."
    ),
    setup=_zero1_setup,
    observe=_zero1_observe,
    expected=_zero1_expected,
    mistakes=(
        Mistake(
            "08-zero1-round-robin",
            "the parameters were dealt by index, one rank after the other; ZeroRedundancyOptimizer deals "
            "them by size, largest first, each to the emptiest rank, which evens the ranks out",
            _owned_as(lambda world: [list(range(r, len(NUMEL), world)) for r in range(world)]),
            hint=(
                "Deal by size: take the indices sorted by numel, largest first, and give each to the rank "
                "with the fewest elements so far (the lowest rank on a tie)."
            ),
        ),
        Mistake(
            "08-zero1-dealt-by-count",
            "the parameters went largest first, but each to the rank with the fewest tensors so far: "
            "ZeroRedundancyOptimizer balances elements, not tensors (one 60-element weight outweighs three "
            "biases), so it adds each parameter's numel() to the rank's load",
            _owned_as(_dealt_by_count),
            hint=(
                "Keep each rank's load in elements: add numel[i], not 1, to the rank that receives parameter "
                "i."
            ),
        ),
        Mistake(
            "08-zero1-not-largest-first",
            "the parameters went to the emptiest rank in registration order; ZeroRedundancyOptimizer sorts "
            "them by size first, largest first (a large tensor dealt last unbalances the ranks)",
            _owned_as(lambda world: zero1_owned(world, order=range(len(NUMEL)))),
            hint=(
                "Deal in order of size: sorted(range(len(numel)), key=lambda i: numel[i], reverse=True) (a "
                "stable sort), each to the emptiest rank."
            ),
        ),
        Mistake(
            "08-zero1-even-split",
            "you counted exactly 1/N of Adam's state on every rank; ZeroRedundancyOptimizer cannot split a "
            "tensor, so each rank holds the moments of the whole parameters it owns, and the shares are uneven",
            _bytes_as(lambda mine, world: 8 * TOTAL + 8 * TOTAL / world),
            hint=(
                "Count the moments of the parameters in `owned` only: 8 * sum(numel[i] for i in owned), "
                "beside 8 bytes per element of the whole model for weights and gradients."
            ),
        ),
        Mistake(
            "08-zero1-sharded-grads",
            "you counted only this rank's share of the gradients (or of the weights): under ZeRO-1 every rank "
            "holds all weights and all gradients; only Adam's moments are split. Sharded gradients are ZeRO-2",
            _bytes_as(lambda mine, world: 4 * TOTAL + 12 * mine),
            hint=(
                "Count every weight and every gradient in full, 4 + 4 bytes per element of the whole model, "
                "and add Adam's 8 bytes per element only for the parameters in `owned`."
            ),
        ),
        Mistake(
            "08-zero1-step-counted",
            "the deal is right, and the bytes are 4 (or 8) per owned tensor too many: Adam's `step` counter, "
            "which the task leaves out (a scalar per tensor, next to the moments' 8 bytes per element)",
            lambda seen, expected: all(
                s.get("zero1_bytes") is not None
                and s.get("owned") == e["owned"]
                and any(
                    math.isclose(s["zero1_bytes"], e["zero1_bytes"] + k * len(e["owned"])) for k in (4, 8)
                )
                for s, e in zip(seen, expected, strict=True)
            ),
            hint=(
                "Count Adam's two moments alone, 8 bytes per element of the owned parameters, and nothing per "
                "tensor."
            ),
        ),
        Mistake(
            "08-zero1-all-sharded",
            "you split weights, gradients and Adam's state alike (16 bytes per element, of this rank's "
            "parameters or of 1/N of the model): that is ZeRO-3 (FSDP); ZeRO-1 splits only Adam's moments",
            lambda seen, expected: (
                _bytes_as(lambda mine, world: 16 * mine)(seen, expected)
                or _bytes_as(lambda mine, world: 16 * TOTAL / world)(seen, expected)
            ),
            hint=(
                "Count weights and gradients whole on every rank (8 bytes per element of the model), then 8 "
                "bytes per element of the owned parameters."
            ),
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
    """What FSDP1 would hold: one flat parameter per unit (the whole model, or each Linear), split into
    equal padded parts, or into its real elements only."""
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
        "`model` is sharded with `fully_shard`: each parameter is a DTensor of which this rank holds some rows "
        "of dim 0. Compute `held_bytes`, the bytes this rank holds for fp32 weights, gradients and Adam's two "
        "moments of its shards (Adam's `step` left out), from the shards themselves; and `gathered_bytes`, the "
        "bytes of the all-gathers that rebuild every full parameter once (FSDP2 pads each parameter's dim 0 "
        "up to a multiple of the world size, so that every rank sends as many rows)."
    ),
    given="`model` (sharded by FSDP2 on these ranks), `world_size`, `rank`",
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
    hint=(
        "A DTensor describes the whole parameter: its `shape` and `numel()` are the full tensor's, and "
        "`to_local()` is the part this rank holds. FSDP2 gives each rank ceil(rows / N) rows until they run "
        "out, so the last ranks can hold fewer, and pads each rank's part to ceil(rows / N) rows for the "
        "all-gather."
    ),
    setup=_fsdp2_setup,
    observe=_fsdp2_observe,
    expected=_fsdp2_expected,
    mistakes=(
        Mistake(
            "08-fsdp2-global-numel",
            "every rank counted the whole model: a DTensor's numel() (and shape) are the full parameter's; "
            "to_local() is this rank's shard",
            _held_is(lambda rank, world: 16 * TOTAL),
            hint="Count this rank's shard: p.to_local().numel(), 16 bytes per element.",
        ),
        Mistake(
            "08-fsdp2-even-split",
            "you counted exactly 1/N of the model on every rank; FSDP2 shards whole rows of dim 0, "
            "ceil(rows / N) per rank until they run out, so the shards are uneven: read them with to_local()",
            _held_is(lambda rank, world: 16 * TOTAL / world),
            hint="Add up each parameter's own shard, as to_local() holds it: 16 bytes per element of each.",
        ),
        Mistake(
            "08-fsdp2-step-counted",
            "the shards are right, and each parameter counted 4 (or 8) bytes too many: Adam's `step` counter, "
            "which the task leaves out",
            lambda seen, expected: all(
                s.get("held_bytes") is not None
                and any(math.isclose(s["held_bytes"], e["held_bytes"] + k * len(SHAPES)) for k in (4, 8))
                for s, e in zip(seen, expected, strict=True)
            ),
            hint=(
                "Count 16 bytes per element of each shard (weight 4, gradient 4, Adam's two moments 8), and "
                "nothing per tensor."
            ),
        ),
        Mistake(
            "08-fsdp2-flat-split",
            "you split the parameters as FSDP1 does: flattened into one flat parameter per unit, cut into N "
            "equal parts. FSDP2 shards each parameter on its own, by rows of dim 0 (ceil(rows / N) per rank "
            "until they run out): read each shard with to_local()",
            _flat,
            hint="Take each parameter on its own: its shard is p.to_local(), some whole rows of its dim 0.",
        ),
        Mistake(
            "08-fsdp2-own-shard-times-n",
            "the all-gather's bytes came out as this rank's shard times N, which holds only on the ranks "
            "with a full ceil(rows / N) rows; a later rank holds fewer, yet the all-gather still moves "
            "ceil(rows / N) rows from every rank, padding included: count from the full shape",
            _own_shard_times_world,
            hint=(
                "Count each all-gather from the full shape: math.ceil(p.shape[0] / world_size) * world_size "
                "rows of math.prod(p.shape[1:]) elements, 4 bytes each."
            ),
        ),
        Mistake(
            "08-fsdp2-no-padding",
            "you counted the parameters' own bytes, but the all-gathers move more: FSDP2 pads each parameter's "
            "dim 0 up to a multiple of the world size, so that every rank sends ceil(rows / N) rows",
            _not_padded,
            hint=(
                "Pad dim 0 up to a multiple of the world size: math.ceil(p.shape[0] / world_size) * "
                "world_size rows, times math.prod(p.shape[1:]) elements, 4 bytes each."
            ),
        ),
    ),
    covers=(),
)

EXERCISES = (ZERO1, FSDP2)
