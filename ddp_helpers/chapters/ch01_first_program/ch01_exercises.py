"""Notebook 01's exercises: make the single-device training DDP (01-convert), deal the shards of a resumed
run (01-shard), then make ranks that start apart agree, train and save (01-wrap).

Probe inputs make each mistake leave its own mark. The datasets record which indices each pass over a
loader drew. 01-convert's training is replayed here, in one process, as DDP computes it (every rank's
gradient on its own batch, averaged), so a right answer's weights are known without running it. 01-wrap's
model is a bias-free float64 Linear that sees a one-hot input per rank: after each SGD step with lr 1,
coordinate r of the weight has moved by minus rank r's share of the gradient, so an average, a sum, an
unshared gradient and gradients that pile up across steps all look different.
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
    """Each rank's place on the pretend nodes its answer ran on (rank_side.node_layout: LOCAL_RANK,
    LOCAL_WORLD_SIZE, GROUP_RANK ...), or None where the answer ran as the machine is, on one node."""
    layouts = field_of(seen, "node layout")
    return layouts if len(seen) > 1 and all(layouts) else None


def _first_of_each_node(name: str) -> Any:
    """The ranks that did `name` (saved, printed) are the first of each node, LOCAL_RANK 0: a guard on
    LOCAL_RANK, where RANK belongs. Named apart from "every rank" only where a node holds two ranks."""

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
    """DistributedSampler's indices for `rank`, written out: a permutation seeded with seed + epoch (0, 1, ...
    with shuffle=False), padded with its own start to a multiple of the world, then every world-th from `rank`."""
    import torch

    generator = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(size, generator=generator).tolist() if shuffle else list(range(size))
    total = -(-size // world) * world
    order += order[: total - size]
    return order[rank:total:world]


def recording_print(printed: list[str]) -> Callable[..., None]:
    """A `print` for the answer's namespace that also writes each line into `printed` (who logged)."""
    import builtins

    def print_(*args: Any, **kwargs: Any) -> None:
        printed.append(" ".join(map(str, args)))
        builtins.print(*args, **kwargs)  # the line still shows, with the rank's other output

    return print_


def _model_and_file(ns: dict[str, Any], ctx: Context, name: str) -> dict[str, Any]:
    """Whether `name` is DDP-wrapped, the plain model's weights, and (rank 0) the keys saved at save_path.
    ("saved", the count of torch.save calls, comes from the observers.)"""
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
    with torch.no_grad():  # the same start on every rank, from a fixed seed, whatever the rank's RNG holds
        model.weight.copy_(0.1 * torch.randn(model.weight.shape, generator=torch.Generator().manual_seed(2),
                                             dtype=torch.float64))  # fmt: skip
    return model


def replay_convert(world: int) -> list[float]:
    """The weights a right answer ends with: each step, every rank's gradient on its own batch, averaged."""
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
    task=(
        "The cell holds `single_device.py`'s training, as every rank runs it. Make it DDP: this process's "
        "rank from the environment torchrun set, a `DistributedSampler` for the loader (and a new order "
        "each epoch), the model wrapped in DDP, and printing and saving on rank 0 only (the plain model's "
        "weights). On the CPU the checker runs your answer as the ranks of 2 nodes (`LOCAL_RANK` and "
        "`local_rank` as torchrun sets them there), where only one rank of the job has RANK 0."
    ),
    given=(
        "`make_dataset()` (45 samples), `make_model()`, `epochs` (2), `batch_size`, `lr`, `save_path`, "
        "`device`, `local_rank`, `os`, `DDP`, `DistributedSampler`, `DataLoader`"
    ),
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
    hint=(
        "Six small edits: RANK from os.environ; sampler=DistributedSampler(dataset) instead of shuffle=True; "
        "DDP(...) around the model (device_ids only on a GPU); sampler.set_epoch(epoch) first in each epoch; "
        "`if rank == 0:` before the print and the save, which saves model.module's weights."
    ),
    setup=_convert_setup,
    observe=_convert_observe,
    expected=_convert_expected,
    mistakes=(
        Mistake(
            "01-convert-whole-dataset",
            "every rank drew all 45 samples each epoch: the loader shuffles by itself, with no "
            "DistributedSampler, so the ranks train on the same data and the job does N times the work",
            _every_rank_drew_all(CONVERT_SIZE),
            hint="Give the loader a DistributedSampler over the dataset (its sampler= argument), kept in a "
            "name for set_epoch, and drop shuffle=True: the sampler deals each rank its own shard, shuffled.",
        ),
        Mistake(
            "01-convert-no-set-epoch",
            "epoch 1 drew exactly epoch 0's order on every rank: the sampler shuffles with seed + epoch, and "
            "learns the epoch only from sampler.set_epoch(epoch)",
            _epochs_repeat,
            hint="sampler.set_epoch(epoch), first in each epoch, before the batches.",
        ),
        Mistake(
            "01-convert-not-wrapped",
            "the model is not a DDP model, and the ranks' weights now differ: each rank followed the "
            "gradients of its own shard, and nobody averaged them",
            _models_apart,
            hint='model = DDP(make_model().to(device), device_ids=[local_rank] if device.type == "cuda" else '
            "None): each backward() through it averages the gradients over the ranks.",
        ),
        Mistake(
            "01-convert-local-rank",
            "the first rank of every node printed and saved (the probe ran as 2 nodes: rank 0 and the first "
            "rank of node 1, below): `rank` holds LOCAL_RANK, a process's place on its own node, so a job of "
            "N nodes prints every line N times and has N writers of one file",
            lambda seen, expected: any(
                _first_of_each_node(name)(seen, expected) for name in ("printed", "saved")
            ),
            hint="Read `rank` from RANK in os.environ: RANK counts the processes of every node, and one "
            "process of the job has RANK 0. LOCAL_RANK (`local_rank`) picks the node's GPU only.",
        ),
        Mistake(
            "01-convert-every-rank-prints",
            "every rank printed: N copies of each line, each about one rank's own batch; print on rank 0 only "
            "(RANK 0: LOCAL_RANK is 0 on the first rank of every node, so on every rank where each node holds "
            "one, as the probe's 2 nodes do at 2 ranks)",
            _every_rank("printed"),
            hint="Put the print under `if rank == 0:`, with `rank` read from RANK, the job's rank (LOCAL_RANK "
            "is 0 on every node's first rank; in the probe's 2 nodes at 2 ranks, on both).",
        ),
        Mistake(
            "01-convert-every-rank-saves",
            "every rank called torch.save on the one file: N writers race, and the file can end up as none "
            "of their saves; save on rank 0 only (RANK 0, not LOCAL_RANK 0, which is one rank per node)",
            _every_rank("saved"),
            hint="Put the save under `if rank == 0:`, with `rank` read from RANK, the job's rank (LOCAL_RANK "
            "is 0 on every node's first rank; in the probe's 2 nodes at 2 ranks, on both).",
        ),
        Mistake(
            "01-convert-module-keys",
            "the saved keys start with 'module.': that is the DDP wrapper's state_dict, which a plain model "
            "refuses to load. Save model.module.state_dict()",
            _module_keys,
            hint="model.module is the plain model inside the DDP wrapper: save its state_dict().",
        ),
        Mistake(
            "01-convert-not-saved",
            "rank 0 wrote no file at save_path: is `rank` this process's rank (int(os.environ['RANK']))?",
            _not_saved,
            hint="`rank` is RANK from os.environ (0 to WORLD_SIZE - 1); under `if rank == 0:`, save the "
            "plain model's state_dict() to save_path itself.",
        ),
    ),
    nodes=2,
    covers=(
        "rank-world",
        "sampler",
        "loader-sampler",
        "set-epoch",
        "ddp-wrap",
        "rank0-logs",
        "rank0-writes",
        "save-module",
        "optimizer-params",
    ),  # fmt: skip
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
        # nothing here runs on a GPU: the answer runs as ranks of 2 nodes on GPU machines too (nodes=2)
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


def _not_shuffled(seen: Seen, expected: Seen) -> bool:
    unshuffled = [sampler_order(SHARD_SIZE, len(seen), r, 0, shuffle=False) for r in range(len(seen))]
    return all(d and all(p == unshuffled[r] for p in d) for r, d in enumerate(field_of(seen, "drawn")))


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
    """The weight after the steps: `start` everywhere, moved `by` at the coordinates of `ranks`."""
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
    task=(
        "Every rank's `model` starts from different weights (rank r's are all r). Wrap it in DDP as "
        "`ddp_model`, make an SGD optimizer (lr 1.0), and train `steps` (2) steps on this rank's `x`, "
        "with the loss `ddp_model(x).sum()`. Then rank 0 alone saves the plain model's `state_dict()` "
        "to `save_path`. On the CPU the checker runs your answer as the ranks of 2 nodes (`LOCAL_RANK` and "
        "`local_rank` as torchrun sets them there), where only one rank of the job has RANK 0."
    ),
    given="`model` (a Linear), `x` (this rank's sample), `steps` (2), `save_path`, `rank`, `local_rank`, `device`",
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
    hint=(
        "The wrap copies rank 0's weights to every rank; DDP averages gradients only for a forward that "
        "went through the wrapper. Clear the gradients each step. Save the model inside the wrapper, from "
        "one rank."
    ),
    setup=_wrap_setup,
    observe=lambda ns, ctx: _model_and_file(ns, ctx, "ddp_model"),
    expected=_wrap_expected,
    mistakes=(
        Mistake(
            "01-wrap-never-wrapped",
            "each rank kept its own start (rank r's weights still hold r) and moved by its own gradient: "
            "without DDP(...) nothing copied rank 0's weights and nothing averaged the gradients",
            _own_steps(float),
            hint="ddp_model = DDP(model, ...): the wrap copies rank 0's weights to every rank, and each "
            "backward through it averages the gradients.",
        ),
        Mistake(
            "01-wrap-not-averaged",
            "the ranks started from rank 0's weights (the wrap happened), but each moved by its own gradient "
            "only: the forward went around the wrapper (model(x), not ddp_model(x)), so DDP averaged nothing",
            _own_steps(lambda r: 0.0),
            hint="Run each step's forward through the wrapper, ddp_model(x): DDP averages the gradients only "
            "of a forward it ran.",
        ),
        Mistake(
            "01-wrap-summed",
            "each step used the SUM of the ranks' gradients, world-size times the average: DDP already "
            "averages, so a gradient all-reduced again steps too far",
            _every_coordinate_moved(lambda world: -float(WRAP_STEPS)),
            hint="Leave the gradients to DDP: its backward has averaged them when optimizer.step() runs, "
            "with no all-reduce of your own.",
        ),
        Mistake(
            "01-wrap-divided-by-world",
            "each step moved the weights by the average gradient divided by the world size once more "
            "(1/world of a right step, below): the loss was divided by the world size, but DDP's backward "
            "already averages the gradients over the ranks (their sum, divided by the world size), so the "
            "average is taken twice",
            _every_coordinate_moved(lambda world: -WRAP_STEPS / world / world),
            hint="Backward the loss as it is, ddp_model(x).sum(), with no division by the world size: DDP "
            "all-reduces the gradients and divides them by the world size itself.",
        ),
        Mistake(
            "01-wrap-grads-pile-up",
            "the weights moved by 1 + 2 = 3 averaged gradients in 2 steps: without optimizer.zero_grad() "
            "each backward() adds to the gradient the last step left",
            _every_coordinate_moved(lambda world: -WRAP_STEPS * (WRAP_STEPS + 1) / 2 / world),
            hint="Call optimizer.zero_grad() at the start of each step, before the backward.",
        ),
        Mistake(
            "01-wrap-local-rank-writer",
            "two ranks saved, one per node (the probe ran as 2 nodes: rank 0 and the first rank of node 1, "
            "`saved` below): `local_rank == 0` holds for the first rank of every node, so a job of N nodes "
            "has N writers of one file, which race, and on a shared filesystem can leave it torn",
            _first_of_each_node("saved"),
            hint="Guard the save with `if rank == 0:`: RANK counts the processes of every node, so one process "
            "of the job has RANK 0. LOCAL_RANK is 0 once per node: it picks the node's GPU.",
        ),
        Mistake(
            "01-wrap-every-rank-saves",
            "every rank called torch.save: N writers of one file race, and on a shared filesystem the "
            "file can end up torn; save from rank 0 only (RANK 0: LOCAL_RANK is 0 on the first rank of every "
            "node, so on every rank where each node holds one, as the probe's 2 nodes do at 2 ranks)",
            _every_rank("saved"),
            hint="Guard the save with `if rank == 0:`, where rank is RANK, the job's rank (LOCAL_RANK is 0 on "
            "every node's first rank; in the probe's 2 nodes at 2 ranks, on both).",
        ),
        Mistake(
            "01-wrap-module-keys",
            "the saved keys start with 'module.': that is the DDP wrapper's state_dict; a model without DDP "
            "refuses it. Save ddp_model.module.state_dict()",
            _module_keys,
            hint="ddp_model.module is the model inside the wrapper: its state_dict() has the plain keys.",
        ),
        Mistake(
            "01-wrap-not-saved",
            "rank 0 wrote no file at save_path",
            _not_saved,
            hint="On rank 0 (`if rank == 0:`, rank being RANK), torch.save(ddp_model.module.state_dict(), "
            "save_path): to save_path itself.",
        ),
    ),
    nodes=2,
    covers=(
        "ddp-wrap",
        "optimizer-params",
        "zero-grad",
        "rank0-writes",
        "save-module",
        "device-from-local-rank",
    ),
)


EXERCISES = (CONVERT, SHARD, WRAP)
