"""Notebook 01's exercises: make the single-device training DDP (01-convert), deal the shards of a resumed
run (01-shard), make ranks that start apart agree, train and save (01-wrap). The datasets record the indices
each pass drew; 01-wrap's one-hot input per rank makes an average, a sum and an unshared gradient differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, field_of


# ------------------------------------------------------------------ shared: the sampler's deal, signatures
def _every_rank_drew_all(size: int) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        drawn = field_of(seen, "drawn")
        return len(seen) > 1 and all(d and all(sorted(p) == list(range(size)) for p in d) for d in drawn)

    return matches


def _epochs_repeat(seen: Seen, expected: Seen) -> bool:
    drawn = field_of(seen, "drawn")
    return all(d and len(d) == 2 and d[1] == d[0] for d in drawn)


def _every_rank(name: str) -> Any:
    return lambda seen, expected: len(seen) > 1 and all(s.get(name) for s in seen)


def _module_keys(seen: Seen, expected: Seen) -> bool:
    return any(k.startswith("module.") for k in (seen[0].get("file_keys") or []))


def _not_saved(seen: Seen, expected: Seen) -> bool:
    return seen[0].get("file_keys") is None and not seen[0].get("error")


def node_layouts(seen: Seen) -> list[dict[str, int]] | None:
    """Each rank's LOCAL_RANK, LOCAL_WORLD_SIZE ... on the pretend nodes, or None on one node."""
    layouts = field_of(seen, "node layout")
    return layouts if len(seen) > 1 and all(layouts) else None


def _first_of_each_node(name: str) -> Any:
    """The ranks that did `name` are the first of each node (of several ranks): a guard on LOCAL_RANK."""

    def matches(seen: Seen, expected: Seen) -> bool:
        layouts = node_layouts(seen)
        if layouts is None:
            return False
        firsts = [layout["LOCAL_RANK"] == 0 for layout in layouts]
        return 1 < sum(firsts) < len(seen) and [bool(s.get(name)) for s in seen] == firsts

    return matches


def sampler_order(
    size: int, world: int, rank: int, epoch: int, seed: int = 0, *, shuffle: bool = True
) -> list[int]:
    """The indices DistributedSampler deals `rank` in `epoch` (after set_epoch)."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(size), world, rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type, var-annotated]
    sampler.set_epoch(epoch)
    return list(sampler)


def recording_print(printed: list[str]) -> Callable[..., None]:
    """A `print` for the answer's namespace that also records each line in `printed`."""
    import builtins

    def print_(*args: Any, **kwargs: Any) -> None:
        printed.append(" ".join(map(str, args)))
        builtins.print(*args, **kwargs)

    return print_


def _model_and_file(ns: dict[str, Any], ctx: Context, name: str) -> dict[str, Any]:
    """Whether `name` is DDP-wrapped, the plain model's weights, and (rank 0) the keys saved at save_path."""
    import os

    import torch

    wrapped: Any = ns.get(name)
    plain: Any = getattr(wrapped, "module", wrapped)
    out: dict[str, Any] = {
        "is_ddp": isinstance(wrapped, torch.nn.parallel.DistributedDataParallel),
        "weight": [round(v, 12) for v in plain.weight.detach().cpu().flatten().tolist()],
    }
    if ctx.rank == 0:
        path = ns["save_path"]
        out["file_keys"] = sorted(torch.load(path, map_location="cpu")) if os.path.exists(path) else None
    return out


# ------------------------------------------------------------------ 01-convert
CONVERT_SIZE = 45  # 2, 3, 4 and 8 ranks do not divide it: the sampler pads
CONVERT_FEATURES, CONVERT_CLASSES = 4, 3
CONVERT_EPOCHS, CONVERT_BATCH, CONVERT_LR = 2, 8, 0.5


def _convert_data() -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(1)
    centres = 2 * torch.randn(CONVERT_CLASSES, CONVERT_FEATURES, generator=gen, dtype=torch.float64)
    labels = torch.randint(CONVERT_CLASSES, (CONVERT_SIZE,), generator=gen)
    return centres[labels] + torch.randn(
        CONVERT_SIZE, CONVERT_FEATURES, generator=gen, dtype=torch.float64
    ), labels


def _convert_setup(ctx: Context) -> dict[str, Any]:
    from ddp_helpers.rank.observers import RecordingDataset

    made: list[Any] = []
    printed: list[str] = []

    def make_dataset() -> Any:
        made.append(RecordingDataset(*_convert_data()))
        return made[-1]

    return {
        "make_dataset": make_dataset,
        "make_model": _convert_model,
        "epochs": CONVERT_EPOCHS,
        "batch_size": CONVERT_BATCH,
        "lr": CONVERT_LR,
        "save_path": f"{ctx.workdir}/model.pt",
        "print": recording_print(printed),
        "_made": made,
        "_printed": printed,
    }


def _convert_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    drawn = [p for p in ns["_made"][0].passes if p] if ns["_made"] else []
    return {"drawn": drawn, "printed": bool(ns["_printed"]), **_model_and_file(ns, ctx, "model")}


def _convert_model() -> Any:
    import torch

    model = torch.nn.Linear(CONVERT_FEATURES, CONVERT_CLASSES, bias=False, dtype=torch.float64)
    start = torch.Generator().manual_seed(2)  # the same start on every rank, whatever its RNG holds
    with torch.no_grad():
        model.weight.copy_(0.1 * torch.randn(model.weight.shape, generator=start, dtype=torch.float64))
    return model


def replay_convert(world: int) -> list[float]:
    """The weights a right answer ends with: each step, the ranks' gradients on their own batches, averaged."""
    import torch
    import torch.nn.functional as F

    x, y = _convert_data()
    weight = _convert_model().weight.detach().clone()
    for epoch in range(CONVERT_EPOCHS):
        orders = [sampler_order(CONVERT_SIZE, world, r, epoch) for r in range(world)]
        for start in range(0, len(orders[0]), CONVERT_BATCH):
            grads = []
            for order in orders:
                w = weight.clone().requires_grad_(True)
                batch = order[start : start + CONVERT_BATCH]
                F.cross_entropy(x[batch] @ w.T, y[batch]).backward()
                grads.append(w.grad)
            weight -= CONVERT_LR * torch.stack(grads).mean(dim=0)
    return [round(v, 12) for v in weight.flatten().tolist()]


def _convert_expected(world: int) -> Seen:
    weight = replay_convert(world)
    rows: Seen = [
        {
            "drawn": [sampler_order(CONVERT_SIZE, world, r, e) for e in range(CONVERT_EPOCHS)],
            "is_ddp": True,
            "weight": weight,
            "printed": r == 0,
            "saved": 1 if r == 0 else 0,
        }
        for r in range(world)
    ]
    rows[0]["file_keys"] = ["weight"]
    return rows


def _models_apart(seen: Seen, expected: Seen) -> bool:
    return (
        len(seen) > 1
        and not any(s.get("is_ddp") for s in seen)
        and any(s.get("weight") != seen[0].get("weight") for s in seen)
    )


CONVERT = Exercise(
    id="01-convert",
    notebook="01",
    title="Make single_device.py's training DDP",
    task="Make the training DDP, one edit per TODO. The checker runs it as 2 nodes: one rank has RANK 0.",
    starter=(
        "rank = ...  # TODO 1: this process's rank, from the environment torchrun set\n"
        "dataset = make_dataset()\n"
        "loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)  # TODO 2: a DistributedSampler\n"
        "model = make_model().to(device)  # TODO 3: wrap it in DDP\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=lr)\n"
        "for epoch in range(epochs):\n"
        "    # TODO 4: one line here, so that each epoch deals a new order\n"
        "    for x, y in loader:\n"
        "        loss = F.cross_entropy(model(x.to(device)), y.to(device))\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        '    print(f"epoch {epoch}: loss {loss.item():.4f}")  # TODO 5: rank 0 only\n'
        "torch.save(model.state_dict(), save_path)  # TODO 6: rank 0 only, the plain model's weights\n"
    ),
    reference=(
        'rank = int(os.environ["RANK"])  # torchrun sets RANK, LOCAL_RANK and WORLD_SIZE\n'
        "dataset = make_dataset()\n"
        "sampler = DistributedSampler(dataset)  # this rank's shard, shuffled\n"
        "loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)  # no shuffle=True\n"
        'model = DDP(make_model().to(device), device_ids=[local_rank] if device.type == "cuda" else None)\n'
        "optimizer = torch.optim.SGD(model.parameters(), lr=lr)\n"
        "for epoch in range(epochs):\n"
        "    sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank\n"
        "    for x, y in loader:\n"
        "        loss = F.cross_entropy(model(x.to(device)), y.to(device))\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()  # DDP averages the gradients over the ranks here\n"
        "        optimizer.step()\n"
        "    if rank == 0:  # one process prints\n"
        '        print(f"epoch {epoch}: loss {loss.item():.4f}")\n'
        "if rank == 0:  # one process saves\n"
        "    torch.save(model.module.state_dict(), save_path)  # .module: keys without 'module.'\n"
    ),
    hint="RANK from os.environ; a DistributedSampler; DDP(...); set_epoch; `if rank == 0:` to print and save.",
    setup=_convert_setup,
    observe=_convert_observe,
    expected=_convert_expected,
    mistakes=(
        Mistake(
            "01-convert-whole-dataset",
            "Every rank drew all 45 samples each epoch: no DistributedSampler dealt the data.",
            _every_rank_drew_all(CONVERT_SIZE),
            hint="Pass sampler=DistributedSampler(dataset) to the loader, in place of shuffle=True.",
        ),
        Mistake(
            "01-convert-no-set-epoch",
            "Epoch 1 drew exactly epoch 0's order: the sampler never learned the epoch.",
            _epochs_repeat,
            hint="Call sampler.set_epoch(epoch) first in each epoch.",
        ),
        Mistake(
            "01-convert-not-wrapped",
            "The model is not wrapped in DDP: the ranks' weights differ, nobody averaged the gradients.",
            _models_apart,
            hint="Wrap the model: DDP(..., device_ids=[local_rank]) on a GPU, device_ids=None on the CPU.",
        ),
        Mistake(
            "01-convert-local-rank",
            "The first rank of every node printed and saved: `rank` holds LOCAL_RANK, a place on one node.",
            lambda seen, expected: any(
                _first_of_each_node(name)(seen, expected) for name in ("printed", "saved")
            ),
            hint="Read `rank` from os.environ['RANK'], counted over every node; LOCAL_RANK picks the GPU.",
        ),
        Mistake(
            "01-convert-every-rank-prints",
            "Every rank printed: N copies of each line (at 2 ranks on 2 nodes, LOCAL_RANK is 0 on both).",
            _every_rank("printed"),
            hint="Print under `if rank == 0:`, `rank` read from RANK.",
        ),
        Mistake(
            "01-convert-every-rank-saves",
            "Every rank saved to the one file: N writers race (at 2 ranks on 2 nodes, LOCAL_RANK is 0 on both).",
            _every_rank("saved"),
            hint="Save under `if rank == 0:`, `rank` read from RANK.",
        ),
        Mistake(
            "01-convert-module-keys",
            "The saved keys start with 'module.': the DDP wrapper's state_dict, which a plain model refuses.",
            _module_keys,
            hint="Save model.module.state_dict().",
        ),
        Mistake(
            "01-convert-not-saved",
            "Rank 0 wrote no file at save_path: is `rank` this process's rank?",
            _not_saved,
            hint="rank = int(os.environ['RANK']); under `if rank == 0:`, save to save_path.",
        ),
    ),
    nodes=2,
    covers=("rank-world", "sampler", "loader-sampler", "set-epoch", "ddp-wrap", "rank0-logs", "rank0-writes")
    + ("save-module", "optimizer-params"),
    timeout_s=60.0,
)


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
        # on the CPU even on GPU machines: the answer runs as 2 nodes there too
        "device": torch.device("cpu"),
    }


def _shard_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return {"drawn": [p for p in ns["dataset"].passes if p]}


def _shard_orders(world: int, rank: int, first: int, seed: int) -> list[list[int]]:
    return [sampler_order(SHARD_SIZE, world, rank, first + e, seed) for e in range(SHARD_EPOCHS)]


def _shard_expected(world: int) -> Seen:
    return [{"drawn": _shard_orders(world, r, SHARD_FIRST_EPOCH, SHARD_SEED)} for r in range(world)]


def _same_shard_everywhere(seen: Seen, expected: Seen) -> bool:
    drawn = field_of(seen, "drawn")
    return len(seen) > 1 and bool(drawn[0]) and all(d == drawn[0] for d in drawn)


def _dealt_by_local_rank(seen: Seen, expected: Seen) -> bool:
    """Each rank drew its LOCAL_RANK's shard, of WORLD_SIZE or of LOCAL_WORLD_SIZE shards."""
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


def _not_shuffled(seen: Seen, expected: Seen) -> bool:
    unshuffled = [sampler_order(SHARD_SIZE, len(seen), r, 0, shuffle=False) for r in range(len(seen))]
    return all(d and all(p == unshuffled[r] for p in d) for r, d in enumerate(field_of(seen, "drawn")))


def _same_order_again(seen: Seen, expected: Seen) -> bool:
    """Each epoch repeated the first one's shuffled order."""
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
    task="Build `sampler` and the epoch loop so that every rank draws its shard of epochs 3 and 4, seed 7.",
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
    hint="The sampler asks the process group for rank and world size; it shuffles with seed + epoch.",
    setup=_shard_setup,
    observe=_shard_observe,
    expected=_shard_expected,
    mistakes=(
        Mistake(
            "01-shard-local-rank",
            "The shards were dealt by LOCAL_RANK: every node drew the same samples (node 1's first rank drew "
            "rank 0's).",
            _dealt_by_local_rank,
            hint="Pass no rank= and no num_replicas=: the sampler asks the process group.",
        ),
        Mistake(
            "01-shard-whole-dataset",
            "Every rank drew every sample: no DistributedSampler dealt the data.",
            _every_rank_drew_all(SHARD_SIZE),
            hint="Give the loader a DistributedSampler built with the run's seed, and no shuffle=True.",
        ),
        Mistake(
            "01-shard-same-shard",
            "Every rank drew rank 0's shard: the sampler was given one rank for all (rank=0, or LOCAL_RANK).",
            _same_shard_everywhere,
            hint="Pass no rank=: the sampler asks the process group for RANK.",
        ),
        Mistake(
            "01-shard-no-shuffle",
            "Every rank drew its shard in the dataset's order, both epochs: shuffle=False.",
            _not_shuffled,
            hint="Leave out shuffle=False: the seed and the epoch keep the order reproducible.",
        ),
        Mistake(
            "01-shard-no-set-epoch",
            "The second epoch drew exactly the first one's order: no sampler.set_epoch(epoch).",
            _same_order_again,
            hint="Call sampler.set_epoch(epoch) first in each epoch.",
        ),
        Mistake(
            "01-shard-from-epoch-0",
            "The ranks drew the orders of epochs 0 and 1, not 3 and 4: the loop counted from 0.",
            _drew_as(0, SHARD_SEED),
            hint="Loop over range(first_epoch, first_epoch + epochs).",
        ),
        Mistake(
            "01-shard-default-seed",
            "The ranks drew the orders of the default seed 0, not the run's seed 7.",
            _drew_as(SHARD_FIRST_EPOCH, 0),
            hint="Pass seed=seed when you build the sampler.",
        ),
    ),
    nodes=2,
    covers=("sampler", "loader-sampler", "set-epoch", "rank-world"),
)


# ------------------------------------------------------------------ 01-wrap
WIDTH = 8  # one-hot inputs: one coordinate per rank, up to 8 ranks
WRAP_STEPS = 2


def _wrap_setup(ctx: Context) -> dict[str, Any]:
    import torch

    model = torch.nn.Linear(max(WIDTH, ctx.world_size), 1, bias=False, dtype=torch.float64).to(ctx.device)
    torch.nn.init.constant_(model.weight, float(ctx.rank))  # every rank starts somewhere else
    x = torch.zeros(1, model.in_features, dtype=torch.float64, device=ctx.device)
    x[0, ctx.rank] = 1.0  # this rank's sample: its gradient is the one-hot of its rank
    return {"model": model, "x": x, "steps": WRAP_STEPS, "save_path": f"{ctx.workdir}/model.pt"}


def _moved(width: int, start: float, by: float, ranks: range) -> list[float]:
    return [start + (by if i in ranks else 0.0) for i in range(width)]


def _wrap_expected(world: int) -> Seen:
    weight = _moved(max(WIDTH, world), 0.0, -WRAP_STEPS / world, range(world))  # rank 0's start, averaged
    rows: Seen = [{"is_ddp": True, "weight": weight, "saved": 1 if r == 0 else 0} for r in range(world)]
    rows[0]["file_keys"] = ["weight"]
    return rows


def _own_steps(start_of_rank: Any) -> Any:
    """Each rank moved by its own gradient only, from `start_of_rank(r)`."""

    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        return world > 1 and all(
            s["weight"] == _moved(len(s["weight"]), start_of_rank(r), -WRAP_STEPS, range(r, r + 1))
            for r, s in enumerate(seen)
        )

    return matches


def _every_coordinate_moved(by: Callable[[int], float]) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        return world > 1 and all(
            s["weight"] == _moved(len(s["weight"]), 0.0, by(world), range(world)) for s in seen
        )

    return matches


WRAP = Exercise(
    id="01-wrap",
    notebook="01",
    title="Make ranks that start apart agree, train, and save from rank 0",
    task="Wrap `model` as `ddp_model`, train `steps` SGD steps (lr 1.0) on `ddp_model(x).sum()`, then rank 0 "
    "alone saves the plain model's `state_dict()` to `save_path`.",
    starter=(
        "ddp_model = ...  # TODO: wrap `model` in DDP\n"
        "# TODO: an SGD optimizer with lr=1.0, then `steps` steps, then rank 0's save\n"
    ),
    reference=(
        'ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)  # rank 0\'s start\n'
        "optimizer = torch.optim.SGD(ddp_model.parameters(), lr=1.0)\n"
        "for _ in range(steps):\n"
        "    optimizer.zero_grad()  # or each step adds to the last one's gradient\n"
        "    ddp_model(x).sum().backward()  # through the wrapper: DDP averages the gradients here\n"
        "    optimizer.step()  # the same averaged step on every rank\n"
        "if rank == 0:  # one writer of the file\n"
        "    torch.save(ddp_model.module.state_dict(), save_path)  # .module: keys without 'module.'\n"
    ),
    hint="Forward through the wrapper, clear the gradients each step, save ddp_model.module from rank 0.",
    setup=_wrap_setup,
    observe=lambda ns, ctx: _model_and_file(ns, ctx, "ddp_model"),
    expected=_wrap_expected,
    mistakes=(
        Mistake(
            "01-wrap-never-wrapped",
            "Each rank kept its own start and its own gradient: the model was never wrapped.",
            _own_steps(float),
            hint="ddp_model = DDP(model, ...) copies rank 0's weights and averages the gradients.",
        ),
        Mistake(
            "01-wrap-not-averaged",
            "The ranks started alike but each moved by its own gradient: the forward went around the wrapper.",
            _own_steps(lambda r: 0.0),
            hint="Call ddp_model(x), not model(x).",
        ),
        Mistake(
            "01-wrap-summed",
            "Each step used the SUM of the ranks' gradients: an all-reduce on top of DDP's average.",
            _every_coordinate_moved(lambda world: -float(WRAP_STEPS)),
            hint="Leave the gradients to DDP: no all-reduce of your own.",
        ),
        Mistake(
            "01-wrap-divided-by-world",
            "Each step was 1/world of a right one: the loss was divided by the world size, and DDP averages too.",
            _every_coordinate_moved(lambda world: -WRAP_STEPS / world / world),
            hint="Backward ddp_model(x).sum() as it is, with no division by the world size.",
        ),
        Mistake(
            "01-wrap-grads-pile-up",
            "The weights moved by 1 + 2 = 3 gradients in 2 steps: the gradients piled up.",
            _every_coordinate_moved(lambda world: -WRAP_STEPS * (WRAP_STEPS + 1) / 2 / world),
            hint="Call optimizer.zero_grad() at the start of each step.",
        ),
        Mistake(
            "01-wrap-local-rank-writer",
            "Two ranks saved, one per node: `local_rank == 0` holds once per node.",
            _first_of_each_node("saved"),
            hint="Guard the save with `if rank == 0:`: RANK counts over every node.",
        ),
        Mistake(
            "01-wrap-every-rank-saves",
            "Every rank saved: N writers of one file race (at 2 ranks on 2 nodes, LOCAL_RANK is 0 on both).",
            _every_rank("saved"),
            hint="Save under `if rank == 0:`, rank being RANK.",
        ),
        Mistake(
            "01-wrap-module-keys",
            "The saved keys start with 'module.': the wrapper's state_dict, which a plain model refuses.",
            _module_keys,
            hint="Save ddp_model.module.state_dict().",
        ),
        Mistake(
            "01-wrap-not-saved",
            "Rank 0 wrote no file at save_path.",
            _not_saved,
            hint="Under `if rank == 0:`, save ddp_model.module's state_dict() to save_path.",
        ),
    ),
    nodes=2,
    covers=("ddp-wrap", "optimizer-params", "zero-grad", "rank0-writes", "save-module")
    + ("device-from-local-rank",),
)


EXERCISES = (CONVERT, SHARD, WRAP)
