"""Notebook 01: 01-shard (see the package's docstring)."""

from __future__ import annotations

from typing import Any

from ddp_helpers.chapters.ch01_first_program.ch01_shared import (
    _epochs_repeat,
    _every_rank_drew_all,
    node_layouts,
    sampler_order,
)
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, field_of

# ------------------------------------------------------------------ 01-shard
SHARD_SIZE = 11  # 2, 3, 4 and 8 ranks do not divide it: the sampler pads, repeating its first indices
SHARD_EPOCHS = 2
SHARD_FIRST_EPOCH = 3  # the run resumes here: epochs 3 and 4 must draw epoch 3's and epoch 4's orders
SHARD_SEED = 7  # the run's seed: every rank must shuffle with it


def _shard_setup(ctx: Context) -> dict[str, Any]:
    import torch

    from ddp_helpers.rank.observers import RecordingDataset

    x = torch.arange(SHARD_SIZE, dtype=torch.float64).unsqueeze(1)
    return {
        "dataset": RecordingDataset(x, torch.arange(SHARD_SIZE)),
        "epochs": SHARD_EPOCHS,
        "first_epoch": SHARD_FIRST_EPOCH,
        "seed": SHARD_SEED,
        "train_step": lambda xb, yb: None,  # the probe needs only the indices drawn
        # nothing here runs on a GPU: the answer runs as ranks of 2 nodes on GPU machines too (nodes=2)
        "device": torch.device("cpu"),
    }


def _shard_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    passes = [p for p in ns["dataset"].passes if p]
    return {"drawn": passes}


def _shard_orders(world: int, rank: int, first: int, seed: int) -> list[list[int]]:
    return [sampler_order(SHARD_SIZE, world, rank, first + e, seed) for e in range(SHARD_EPOCHS)]


def _shard_expected(world: int) -> Seen:
    return [{"drawn": _shard_orders(world, r, SHARD_FIRST_EPOCH, SHARD_SEED)} for r in range(world)]


def _same_shard_everywhere(seen: Seen, expected: Seen) -> bool:
    drawn = field_of(seen, "drawn")
    return len(seen) > 1 and bool(drawn[0]) and all(d == drawn[0] for d in drawn)


def _dealt_by_local_rank(seen: Seen, expected: Seen) -> bool:
    """Each rank drew the shard of its LOCAL_RANK, of WORLD_SIZE shards or of LOCAL_WORLD_SIZE (then at 2
    ranks, one per node, every rank draws all). Where every node holds one rank, rank=LOCAL_RANK alone is
    rank=0 everywhere, and named so: 01-shard-same-shard."""
    layouts = node_layouts(seen)
    if layouts is None:
        return False
    world = len(seen)
    local = [layout["LOCAL_RANK"] for layout in layouts]
    per_node = [layout["LOCAL_WORLD_SIZE"] for layout in layouts]
    drawn = field_of(seen, "drawn")

    def dealt_over(sizes: list[int]) -> bool:
        return all(
            d == _shard_orders(n, r, SHARD_FIRST_EPOCH, SHARD_SEED)
            for d, n, r in zip(drawn, sizes, local, strict=True)
        )

    return (any(local) and dealt_over([world] * world)) or dealt_over(per_node)


def _unshuffled_order(world: int, rank: int) -> list[int]:
    """DistributedSampler(shuffle=False)'s indices for `rank`: 0, 1, ... padded with its own start."""
    total = -(-SHARD_SIZE // world) * world
    order = list(range(SHARD_SIZE))
    return (order + order[: total - SHARD_SIZE])[rank:total:world]


def _not_shuffled(seen: Seen, expected: Seen) -> bool:
    world = len(seen)
    return all(
        d and all(p == _unshuffled_order(world, r) for p in d) for r, d in enumerate(field_of(seen, "drawn"))
    )


def _same_order_again(seen: Seen, expected: Seen) -> bool:
    """Each epoch repeated the first one's shuffled order (an order never shuffled is 01-shard-no-shuffle)."""
    return _epochs_repeat(seen, expected) and not _not_shuffled(seen, expected)


def _drew_as(first: int, seed: int) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        return all(s.get("drawn") == _shard_orders(world, r, first, seed) for r, s in enumerate(seen))

    return matches


SHARD = Exercise(
    id="01-shard",
    notebook="01",
    title="Deal the shards of a resumed run",
    task=(
        "A run resumes at epoch `first_epoch` (3) for `epochs` (2) more epochs, and shuffles with its own "
        "`seed` (7). Build `sampler` over `dataset` and write the epoch loop so that every rank draws its "
        "shard of exactly the order that epoch 3, then epoch 4, of this run deals. The checker runs your "
        "answer as the ranks of 2 nodes (`LOCAL_RANK` and `local_rank` as torchrun sets them there), where a "
        "process's place on its node is not its place in the job."
    ),
    given="`dataset` (11 samples), `first_epoch` (3), `epochs` (2), `seed` (7), `train_step(x, y)`",
    starter=(
        "sampler = ...  # TODO: a DistributedSampler over `dataset`, with the run's seed\n"
        "loader = DataLoader(dataset, batch_size=2, sampler=sampler)\n"
        "for epoch in range(epochs):  # TODO: the resumed run's own epoch numbers\n"
        "    ...  # TODO: one line, before the batches\n"
        "    for x, y in loader:\n"
        "        train_step(x, y)\n"
    ),
    reference=(
        "sampler = DistributedSampler(dataset, seed=seed)  # asks the process group for rank and world size\n"
        "loader = DataLoader(dataset, batch_size=2, sampler=sampler)  # the sampler shuffles, not the loader\n"
        "for epoch in range(first_epoch, first_epoch + epochs):  # the resumed epochs' own numbers\n"
        "    sampler.set_epoch(epoch)  # shuffles with seed + epoch: a new order each epoch\n"
        "    for x, y in loader:\n"
        "        train_step(x, y)\n"
    ),
    hint=(
        "The sampler asks the process group for its rank and the world size; pass neither. It shuffles "
        "with seed + epoch: the seed is a constructor argument, and the epoch comes from one call only."
    ),
    setup=_shard_setup,
    observe=_shard_observe,
    expected=_shard_expected,
    mistakes=(
        Mistake(
            "01-shard-local-rank",
            "the shards were dealt by LOCAL_RANK, a process's place on its own node: the probe ran as 2 "
            "nodes, and the ranks of node 1 drew the samples that the ranks of node 0 drew (node 1's first "
            "rank drew what rank 0 drew, below), so every node trains on the same samples and the rest of "
            "the data is never seen",
            _dealt_by_local_rank,
            hint="Deal by RANK over WORLD_SIZE: a DistributedSampler given no rank= and no num_replicas= "
            "asks the process group for both. LOCAL_RANK picks a GPU on the node, never a shard.",
        ),
        Mistake(
            "01-shard-whole-dataset",
            "every rank drew every sample: no DistributedSampler dealt the data (the loader has none, or it "
            "was told of one replica), so each rank trains on the whole dataset and an epoch does world-size "
            "times the work",
            _every_rank_drew_all(SHARD_SIZE),
            hint="Give the loader a DistributedSampler (its sampler= argument, with the run's seed and no "
            "num_replicas=), and no shuffle=True: the sampler deals each rank its own shard, and shuffles it.",
        ),
        Mistake(
            "01-shard-same-shard",
            "every rank drew the same indices, rank 0's shard: the sampler was given one rank for all "
            "(rank=0; or LOCAL_RANK, which is 0 on every rank when each node holds one, as the probe's 2 "
            "nodes do at 2 ranks), so the ranks train on one shard and the rest of the data is never seen",
            _same_shard_everywhere,
            hint="Pass no rank=: the sampler asks the process group for this process's RANK, counted over "
            "every node. LOCAL_RANK numbers the processes of one node only.",
        ),
        Mistake(
            "01-shard-no-shuffle",
            "every rank drew its shard in the dataset's own order (0, 1, 2, ... dealt one each in turn), the "
            "same in both epochs: the sampler was built with shuffle=False, so set_epoch changes nothing and "
            "every epoch trains on the same batches in the same order",
            _not_shuffled,
            hint="Leave out shuffle=False: DistributedSampler shuffles by default, with seed + the epoch "
            "that set_epoch gives it. A resumed run stays reproducible through the seed and the epoch.",
        ),
        Mistake(
            "01-shard-no-set-epoch",
            "the second epoch drew exactly the first one's order on every rank: without "
            "sampler.set_epoch(epoch) the sampler shuffles with the same seed + epoch every time",
            _same_order_again,
            hint="Call sampler.set_epoch(epoch) first in each epoch, before the batches, with the resumed "
            "run's own epoch number.",
        ),
        Mistake(
            "01-shard-from-epoch-0",
            "the ranks drew the orders of epochs 0 and 1, not 3 and 4: the loop counted from 0, so the "
            "resumed run repeats the orders it trained on before it stopped",
            _drew_as(0, SHARD_SEED),
            hint="Count the loop from first_epoch: range(first_epoch, first_epoch + epochs), so that "
            "set_epoch gets 3, then 4.",
        ),
        Mistake(
            "01-shard-default-seed",
            "the ranks drew the orders of the default seed (0), not the run's seed 7: pass seed=seed to "
            "the sampler (the same value on every rank)",
            _drew_as(SHARD_FIRST_EPOCH, 0),
            hint="Pass seed=seed when you build the sampler: the seed is a constructor argument, and "
            "set_epoch adds the epoch to it.",
        ),
    ),
    nodes=2,
    covers=("sampler", "loader-sampler", "set-epoch", "rank-world"),
)
