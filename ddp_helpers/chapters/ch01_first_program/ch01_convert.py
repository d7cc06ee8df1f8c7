"""Notebook 01: 01-convert (see the package's docstring)."""

from __future__ import annotations

from typing import Any

from ddp_helpers.chapters.ch01_first_program.ch01_shared import (
    _epochs_repeat,
    _every_rank,
    _every_rank_drew_all,
    _first_of_each_node,
    _module_keys,
    _not_saved,
    sampler_order,
)
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen

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
    import builtins

    from ddp_helpers.rank.observers import RecordingDataset

    made: list[Any] = []
    printed: list[str] = []

    def make_dataset() -> Any:
        made.append(RecordingDataset(*_convert_data()))
        return made[-1]

    def make_model() -> Any:
        return _convert_model()

    def recording_print(*args: Any, **kwargs: Any) -> None:
        printed.append(" ".join(map(str, args)))
        builtins.print(*args, **kwargs)

    return {
        "make_dataset": make_dataset,
        "make_model": make_model,
        "epochs": CONVERT_EPOCHS,
        "batch_size": CONVERT_BATCH,
        "lr": CONVERT_LR,
        "save_path": f"{ctx.workdir}/model.pt",
        "print": recording_print,
        "_made": made,
        "_printed": printed,
    }


def _convert_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import os

    import torch

    wrapped: Any = ns.get("model")
    plain: Any = getattr(wrapped, "module", wrapped)
    out: dict[str, Any] = {
        "drawn": [p for p in ns["_made"][0].passes if p] if ns["_made"] else [],
        "is_ddp": isinstance(wrapped, torch.nn.parallel.DistributedDataParallel),
        "weight": [round(v, 12) for v in plain.weight.detach().cpu().flatten().tolist()],
        "printed": bool(ns["_printed"]),
    }  # "saved", the count of torch.save calls, comes from the observers
    if ctx.rank == 0:
        path = ns["save_path"]
        out["file_keys"] = sorted(torch.load(path, map_location="cpu")) if os.path.exists(path) else None
    return out


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
