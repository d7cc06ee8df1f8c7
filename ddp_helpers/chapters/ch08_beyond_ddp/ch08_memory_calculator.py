"""Bytes per rank at the end of forward, and bytes sent per step, by arithmetic alone: notebook 08's calculator.

predict(Setup(width=64, depth=2, batch=8, world=2, strategy="zero2", precision="bf16"))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

STRATEGIES = ("ddp", "ddp_default", "zero1", "zero2", "fsdp2")
PRECISIONS = ("fp32", "bf16")
FSDP = ("zero2", "fsdp2")
PARTS = ("parameters", "gradients", "optimizer", "activations")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")

WHY = {  # what each strategy keeps, in a sentence: the calculator's explanation of its bars
    "ddp": "DDP with gradient_as_bucket_view=True: 4 bytes/param of weights, 4 of gradients (each .grad a view "
    "of its all-reduce bucket) and 8 of Adam, on every rank",
    "ddp_default": "DDP's default (gradient_as_bucket_view=False): its flat buckets are a second copy of the "
    "gradients, 20 bytes/param instead of 16",
    "zero1": "ZeroRedundancyOptimizer: Adam's state for whole tensors, dealt largest first to the emptiest rank; "
    "weights and gradients full; it broadcasts each owner's stepped weights",
    "zero2": "FSDP2 with reshard_after_forward=False: every unit stays gathered from its forward to its backward "
    "(one all-gather per step); gradients and Adam's state sharded",
    "fsdp2": "FSDP2 (ZeRO-3): each block is freed after its forward and gathered again for backward; only the "
    "root's layers stay gathered in between",
}


@dataclass(frozen=True)
class Setup:
    """One configuration: the model's shape, the batch on each rank, the world and how it is split."""

    width: int
    depth: int
    batch: int  # samples per rank per step
    world: int
    strategy: str = "ddp"
    precision: str = "fp32"
    recompute: bool = False  # activation checkpointing of each block
    features: int = 32
    classes: int = 10

    def __post_init__(self) -> None:
        for name in ("width", "depth", "batch", "world", "features", "classes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision == "bf16" and self.strategy not in FSDP:
            raise ValueError(
                f"bf16 here is FSDP2's MixedPrecisionPolicy: use zero2 or fsdp2, not {self.strategy}"
            )


def block_mlp_shapes(features: int, width: int, depth: int, classes: int) -> list[tuple[int, ...]]:
    """BlockMLP's parameter shapes in `model.parameters()` order: embed, each block, head."""
    blocks = [(width, width), (width,)] * depth
    return [(width, features), (width,), *blocks, (classes, width), (classes,)]


def shard_numel(shape: tuple[int, ...], rank: int, world: int) -> int:
    """Elements of `shape` that FSDP2 keeps on `rank`: rows of dim 0 as torch.chunk splits them."""
    rows = math.ceil(shape[0] / world)
    return max(0, min(rows, shape[0] - rank * rows)) * math.prod(shape[1:])


def padded_numel(shape: tuple[int, ...], world: int) -> int:
    """Elements FSDP2's collectives move for `shape`: dim 0 padded up to a multiple of the world size."""
    return math.ceil(shape[0] / world) * world * math.prod(shape[1:])


def zero1_owners(numels: list[int], world: int, order: Any = None, weigh: Any = None) -> list[list[int]]:
    """ZeroRedundancyOptimizer's partition: largest first, each to the least loaded rank (`order`, `weigh`: others)."""
    owners: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for index in (
        sorted(range(len(numels)), key=lambda i: numels[i], reverse=True) if order is None else order
    ):
        rank = load.index(min(load))
        owners[rank].append(index)
        load[rank] += numels[index] if weigh is None else weigh(index)
    return owners


def activation_bytes(s: Setup) -> int:
    """What autograd saves for backward on one rank, each storage once (weights left out)."""
    size = 2 if s.precision == "bf16" else 4
    per_block = 1 if s.recompute else 2
    per_sample = size * (s.features + per_block * s.depth * s.width + s.width + s.classes) + 8
    return s.batch * per_sample + size


def sent_bytes(s: Setup, shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """Bytes each collective is called with in one step (the full size, not what a ring moves per link)."""
    params = sum(math.prod(shape) for shape in shapes)
    sent = dict.fromkeys(COLLECTIVES, 0)
    if s.strategy not in FSDP:
        sent["all_reduce"] = 4 * params
        sent["broadcast"] = 4 * params if s.strategy == "zero1" else 0
        return sent
    gathered = 2 if s.precision == "bf16" else 4
    everything = sum(padded_numel(shape, s.world) for shape in shapes)
    blocks = sum(padded_numel(shape, s.world) for shape in shapes[2:-2])
    again = blocks if s.strategy == "fsdp2" else 0  # resharded after forward: gathered again in backward
    sent["all_gather"] = gathered * (everything + again)
    sent["reduce_scatter"] = 4 * everything  # reduce_dtype=float32
    return sent


def held_bytes(s: Setup, shapes: list[tuple[int, ...]], rank: int) -> dict[str, int]:
    """What `rank` holds at the end of forward, by kind."""
    numels = [math.prod(shape) for shape in shapes]
    params, tensors = sum(numels), len(shapes)
    if s.strategy in FSDP:
        own = sum(shard_numel(shape, rank, s.world) for shape in shapes)
        gathered = 2 if s.precision == "bf16" else 4
        still_full = params if s.strategy == "zero2" else numels[0] + numels[1] + numels[-2] + numels[-1]
        return {
            "parameters": 4 * own + gathered * still_full,  # fp32 shards + the units not resharded
            "gradients": 4 * own,
            "optimizer": 8 * own + 4 * tensors,  # Adam's exp_avg, exp_avg_sq, and a 4-byte step per tensor
        }
    optimizer = 8 * params + 4 * tensors
    if s.strategy == "zero1":
        optimizer = sum(8 * numels[i] + 4 for i in zero1_owners(numels, s.world)[rank])
    return {
        "parameters": 4 * params,
        "gradients": (8 if s.strategy == "ddp_default" else 4) * params,
        "optimizer": optimizer,
    }


def predict(s: Setup) -> list[dict]:
    """Each rank's bytes at the end of forward, and `sent`: the bytes of each collective in the step."""
    shapes = block_mlp_shapes(s.features, s.width, s.depth, s.classes)
    sent = sent_bytes(s, shapes)
    return [
        {**held_bytes(s, shapes, rank), "activations": activation_bytes(s), "sent": dict(sent)}
        for rank in range(s.world)
    ]


def ring_bytes_per_rank(sent: dict[str, int], world: int) -> float:
    """What one rank puts on the wire for `sent` on a ring: 2(N-1)/N of an all-reduce, (N-1)/N of the rest."""
    share = (world - 1) / world
    return 2 * share * sent.get("all_reduce", 0) + share * sum(
        sent.get(kind, 0) for kind in ("all_gather", "reduce_scatter", "broadcast")
    )


def disagreements(predicted: list[dict], measured: list[dict], rtol: float = 0.0) -> list[str]:
    """Where `measured` differs from `predicted` by more than `rtol` (relative), one line each."""
    if len(predicted) != len(measured):
        return [f"{len(measured)} ranks measured, {len(predicted)} predicted"]
    lines = []
    for rank, (want, got) in enumerate(zip(predicted, measured, strict=True)):
        pairs = [(part, want[part], got[part]) for part in PARTS]
        pairs += [(f"sent {kind}", want["sent"][kind], got["sent"].get(kind, 0)) for kind in COLLECTIVES]
        for name, expected, actual in pairs:
            if abs(actual - expected) > rtol * expected:
                lines.append(f"rank {rank} {name}: predicted {expected:,}, measured {actual:,}")
    return lines
