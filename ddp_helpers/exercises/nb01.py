"""Notebook 01's exercises: deal the shards (sampler, set_epoch), then wrap, step and save (DDP, rank 0).

Probe inputs make each mistake leave its own mark. The dataset records which indices each pass over a
loader drew. The model is a bias-free float64 Linear that starts at zero and sees a one-hot input per
rank: after one SGD step with lr 1, coordinate r of the weight is minus rank r's share of the gradient,
so an average, a sum and an unshared gradient all look different.
"""

from __future__ import annotations

from typing import Any

from .spec import Context, Exercise, Mistake, Seen, field_of

# ------------------------------------------------------------------ 01-shard
SHARD_SIZE = 11  # 2, 3, 4 and 8 ranks do not divide it: the sampler pads, repeating its first indices
SHARD_EPOCHS = 2


def _shard_setup(ctx: Context) -> dict[str, Any]:
    import torch

    from .observers import RecordingDataset

    x = torch.arange(SHARD_SIZE, dtype=torch.float64).unsqueeze(1)
    return {
        "dataset": RecordingDataset(x, torch.arange(SHARD_SIZE)),
        "epochs": SHARD_EPOCHS,
        "train_step": lambda xb, yb: None,  # the probe needs only the indices drawn
    }


def _shard_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    passes = [p for p in ns["dataset"].passes if p]
    return {"drawn": passes}


def sampler_order(size: int, world: int, rank: int, epoch: int, seed: int = 0) -> list[int]:
    """DistributedSampler's indices for `rank`, written out: a permutation seeded with seed + epoch, padded
    with its own start to a multiple of the world, then every world-th from position `rank`."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(size, generator=generator).tolist()
    total = -(-size // world) * world
    order += order[: total - size]
    return order[rank:total:world]


def _shard_expected(world: int) -> Seen:
    return [
        {"drawn": [sampler_order(SHARD_SIZE, world, r, e) for e in range(SHARD_EPOCHS)]} for r in range(world)
    ]


def _every_rank_drew_all(seen: Seen, expected: Seen) -> bool:
    drawn = field_of(seen, "drawn")
    return len(seen) > 1 and all(d and all(sorted(p) == list(range(SHARD_SIZE)) for p in d) for d in drawn)


def _same_shard_everywhere(seen: Seen, expected: Seen) -> bool:
    drawn = field_of(seen, "drawn")
    return len(seen) > 1 and bool(drawn[0]) and all(d == drawn[0] for d in drawn)


def _epochs_repeat(seen: Seen, expected: Seen) -> bool:
    drawn = field_of(seen, "drawn")
    return all(d and len(d) == SHARD_EPOCHS and d[0] == e["drawn"][0] and d[1] == d[0]
               for d, e in zip(drawn, expected, strict=True))  # fmt: skip


SHARD = Exercise(
    id="01-shard",
    notebook="01",
    title="Deal each rank its shard, anew each epoch",
    task=(
        "Build `sampler`, a `DistributedSampler` over `dataset`, and make each epoch's loop draw a new order "
        "(the same on every rank), so that the ranks' shards cover the dataset, disjoint but for the few samples "
        "the sampler repeats to make the shards equal."
    ),
    given="`dataset` (11 samples), `epochs` (2), `train_step(x, y)`, `DataLoader`, `DistributedSampler`",
    starter=(
        "sampler = ...  # TODO: a DistributedSampler over `dataset`\n"
        "loader = DataLoader(dataset, batch_size=2, sampler=sampler)\n"
        "for epoch in range(epochs):\n"
        "    ...  # TODO: one line, before the batches\n"
        "    for x, y in loader:\n"
        "        train_step(x, y)\n"
    ),
    reference=(
        "sampler = DistributedSampler(dataset)  # asks the process group for rank and world size\n"
        "loader = DataLoader(dataset, batch_size=2, sampler=sampler)  # the sampler shuffles, not the loader\n"
        "for epoch in range(epochs):\n"
        "    sampler.set_epoch(epoch)  # shuffles with seed + epoch: a new order each epoch\n"
        "    for x, y in loader:\n"
        "        train_step(x, y)\n"
    ),
    hint=(
        "The sampler asks the process group for its rank and the world size; pass neither. It shuffles "
        "with seed + epoch, and learns the epoch from one call only."
    ),
    setup=_shard_setup,
    observe=_shard_observe,
    expected=_shard_expected,
    mistakes=(
        Mistake(
            "01-shard-whole-dataset",
            "every rank drew every sample: the loader has no DistributedSampler, so each rank trains on "
            "the whole dataset and an epoch does world-size times the work",
            _every_rank_drew_all,
        ),
        Mistake(
            "01-shard-same-shard",
            "every rank drew the same indices: the sampler was given one rank (rank=0?) for all, so the "
            "ranks train on one shard and the rest of the data is never seen",
            _same_shard_everywhere,
        ),
        Mistake(
            "01-shard-no-set-epoch",
            "epoch 1 drew exactly epoch 0's order on every rank: without sampler.set_epoch(epoch) the "
            "sampler shuffles with the same seed every epoch",
            _epochs_repeat,
        ),
    ),
    covers=("sampler", "loader-sampler", "set-epoch", "rank-world"),
)

# ------------------------------------------------------------------ 01-wrap
WIDTH = 8  # one-hot inputs: one coordinate per rank, up to 8 ranks


def _wrap_setup(ctx: Context) -> dict[str, Any]:
    import torch

    model = torch.nn.Linear(max(WIDTH, ctx.world_size), 1, bias=False, dtype=torch.float64).to(ctx.device)
    torch.nn.init.zeros_(model.weight)
    x = torch.zeros(1, model.in_features, dtype=torch.float64, device=ctx.device)
    x[0, ctx.rank] = 1.0  # this rank's sample: its gradient is the one-hot of its rank
    return {"model": model, "x": x, "save_path": f"{ctx.workdir}/model.pt"}


def _wrap_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import os

    import torch

    wrapped: Any = ns.get("ddp_model")
    plain: Any = getattr(wrapped, "module", wrapped)
    out: dict[str, Any] = {
        "is_ddp": isinstance(wrapped, torch.nn.parallel.DistributedDataParallel),
        "weight": [round(v, 12) for v in plain.weight.detach().cpu().flatten().tolist()],
    }  # "saved", the count of torch.save calls, comes from the observers
    if ctx.rank == 0:
        path = ns["save_path"]
        out["file_keys"] = sorted(torch.load(path, map_location="cpu")) if os.path.exists(path) else None
    return out


def _wrap_expected(world: int) -> Seen:
    width = max(WIDTH, world)
    weight = [-1.0 / world if i < world else 0.0 for i in range(width)]  # lr 1 times the averaged one-hots
    rows: Seen = [{"is_ddp": True, "weight": weight, "saved": 1 if r == 0 else 0} for r in range(world)]
    rows[0]["file_keys"] = ["weight"]
    return rows


def _own_gradients(seen: Seen, expected: Seen) -> bool:
    return len(seen) > 1 and all(
        s["weight"] == [-1.0 if i == r else 0.0 for i in range(len(s["weight"]))] for r, s in enumerate(seen)
    )


def _summed(seen: Seen, expected: Seen) -> bool:
    world = len(seen)
    return world > 1 and all(
        s["weight"][:world] == [-1.0] * world and not any(s["weight"][world:]) for s in seen
    )


WRAP = Exercise(
    id="01-wrap",
    notebook="01",
    title="Wrap the model, train a step, save from rank 0",
    task=(
        "Wrap `model` in DDP as `ddp_model` (the rank's GPU on GPUs, no device_ids on the CPU), then, after "
        "the step, let rank 0 alone save the plain model's `state_dict()` to `save_path`."
    ),
    given="`model` (a Linear), `x` (this rank's sample), `save_path`, `rank`, `local_rank`, `device`, `DDP`",
    starter=(
        "ddp_model = ...  # TODO: wrap `model` in DDP\n"
        "optimizer = torch.optim.SGD(ddp_model.parameters(), lr=1.0)\n"
        "loss = ddp_model(x).sum()\n"
        "loss.backward()\n"
        "optimizer.step()\n"
        "# TODO: rank 0 alone saves the plain model's weights to save_path\n"
    ),
    reference=(
        'ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)\n'
        "optimizer = torch.optim.SGD(ddp_model.parameters(), lr=1.0)\n"
        "loss = ddp_model(x).sum()  # through the wrapper: its hooks all-reduce in backward\n"
        "loss.backward()  # DDP averages the gradients over the ranks here\n"
        "optimizer.step()\n"
        "if rank == 0:  # one writer\n"
        "    torch.save(ddp_model.module.state_dict(), save_path)  # .module: keys without 'module.'\n"
    ),
    hint=(
        "DDP averages gradients only for a forward that went through the wrapper. Save the model inside the "
        "wrapper, from one rank."
    ),
    setup=_wrap_setup,
    observe=_wrap_observe,
    expected=_wrap_expected,
    mistakes=(
        Mistake(
            "01-wrap-not-averaged",
            "each rank's weights moved by its own gradient only: no DDP wrapper averaged them, so the "
            "ranks' models now differ",
            _own_gradients,
        ),
        Mistake(
            "01-wrap-summed",
            "the step used the SUM of the ranks' gradients, world-size times the average: DDP already "
            "averages, so a gradient all-reduced again (or not divided) steps too far",
            _summed,
        ),
        Mistake(
            "01-wrap-every-rank-saves",
            "every rank called torch.save: N writers of one file race, and on a shared filesystem the "
            "file can end up torn; save from rank 0 only",
            lambda seen, expected: len(seen) > 1 and all(s.get("saved") for s in seen),
        ),
        Mistake(
            "01-wrap-module-keys",
            "the saved keys start with 'module.': that is the DDP wrapper's state_dict; a model without DDP "
            "refuses it. Save ddp_model.module.state_dict()",
            lambda seen, expected: any(k.startswith("module.") for k in (seen[0].get("file_keys") or [])),
        ),
        Mistake(
            "01-wrap-not-saved",
            "rank 0 wrote no file at save_path",
            lambda seen, expected: seen[0].get("file_keys") is None and not seen[0].get("error"),
        ),
    ),
    covers=("ddp-wrap", "optimizer-params", "rank0-writes", "save-module", "device-from-local-rank"),
)

EXERCISES = (SHARD, WRAP)
