"""Notebook 04's exercises: save a checkpoint that resumes exactly (04-save), choose it on rank 0 (04-choose),
resume from it (04-resume). `simulate` writes out the uninterrupted run in plain torch math, so that each
missing piece of a resume (optimizer, RNG, loader generator, skipped batches) leaves its own mark.
"""

from __future__ import annotations

import copy
from typing import Any

from ddp_helpers.chapters.ch01_first_program.ch01_exercises import _first_of_each_node, sampler_order
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, close, field_of

# ------------------------------------------------------------------ 04-save
SAVE_EPOCH, SAVE_BATCH = 1, 3  # where the run stands when it saves: epoch 1, 3 batches of it trained
SAVE_RNG_SEED = 1000  # each rank's global generator: seed 1000 + rank
SAVE_LOADER_SEED = 2000  # each rank's loader generator: seed 2000 + rank
SAVE_SCALE = 1024.0  # the GradScaler's scale: not the default 65536, so a fresh scaler shows
SAVE_REQUIRED = ("model", "optimizer", "scaler", "epoch", "batch_in_epoch", "rng")
_previous_inode: dict[str, int] = {}  # rank 0: the older checkpoint's inode, by path


def _generator(state_or_seed: Any) -> Any:
    import torch

    if isinstance(state_or_seed, torch.Generator):
        return state_or_seed
    if isinstance(state_or_seed, int):
        return torch.Generator().manual_seed(state_or_seed)
    return torch.Generator().set_state(state_or_seed.cpu())


def _draw_float(state_or_seed: Any) -> float:
    """The next torch.rand a generator gives (a fingerprint of its state)."""
    import torch

    return torch.rand(1, dtype=torch.float64, generator=_generator(state_or_seed)).item()


def _seeds(state_or_seed: Any, count: int = 1) -> list[int]:
    """The next `count` numbers DataLoader iter() calls draw from a generator (its workers' base seed)."""
    import torch

    generator = _generator(state_or_seed)
    return [int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) for _ in range(count)]


def _save_setup(ctx: Context) -> dict[str, Any]:
    import os

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    folder = os.path.join(ctx.workdir, "checkpoints")
    path = os.path.join(folder, "last.pt")
    if ctx.rank == 0:  # the previous checkpoint, which the new one replaces
        os.makedirs(folder, exist_ok=True)
        torch.save({"epoch": 0, "batch_in_epoch": 0, "note": "the previous checkpoint"}, path)
        _previous_inode[path] = os.stat(path).st_ino
    model = torch.nn.Linear(4, 1, bias=False, dtype=torch.float64).to(ctx.device)
    with torch.no_grad():
        model.weight.copy_(torch.arange(1.0, 5.0, dtype=torch.float64))
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9)
    model.weight.grad = torch.ones_like(model.weight)  # one step: the optimizer now holds momentum buffers
    optimizer.step()
    scaler = torch.amp.GradScaler(ctx.device.type, init_scale=SAVE_SCALE)
    dataset = TensorDataset(torch.arange(8 * max(ctx.world_size, 1)))
    sampler: DistributedSampler[Any] = DistributedSampler(dataset)
    sampler.set_epoch(SAVE_EPOCH)
    loader = DataLoader(
        dataset,
        batch_size=1,
        sampler=sampler,
        generator=torch.Generator().manual_seed(SAVE_LOADER_SEED + ctx.rank),
    )
    assert loader.generator is not None
    generator_at_epoch_start = loader.generator.get_state()  # the loop kept it before iter(loader)
    batches = iter(loader)  # this epoch's iter(): it drew its workers' seed from the loader's generator
    for _ in range(SAVE_BATCH):
        next(batches)
    torch.manual_seed(SAVE_RNG_SEED + ctx.rank)  # each rank's own random state, at the save
    return {
        "ddp_model": ddp_model,
        "optimizer": optimizer,
        "scaler": scaler,
        "loader": loader,
        "epoch": SAVE_EPOCH,
        "batch_in_epoch": SAVE_BATCH,
        "generator_at_epoch_start": generator_at_epoch_start,
        "path": path,
    }


def _save_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import os

    import torch

    collectives = ns.get("_collectives") or []
    # judged by effect, not by name: any gather that brings rank 0 every state will do (all_gather_object,
    # or gather_object to rank 0 alone); what every rank must do is end at a barrier
    waited = {"ends at a barrier": bool(collectives) and collectives[-1] == "barrier"}
    if ctx.rank != 0:
        return waited  # "saved" comes from the observers
    path = ns["path"]
    out: dict[str, Any] = {"files": sorted(os.listdir(os.path.dirname(path))), **waited}
    if not os.path.exists(path):
        return out
    out["replaced"] = os.stat(path).st_ino != _previous_inode.get(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a torn file, or an object weights_only refuses
        out["file_error"] = f"{type(error).__name__}: {error}"
        return out
    if not isinstance(ckpt, dict):
        return out
    out["missing_keys"] = [k for k in SAVE_REQUIRED if k not in ckpt]
    out["epoch"] = ckpt.get("epoch")
    out["batch_in_epoch"] = ckpt.get("batch_in_epoch")
    ddp_model, optimizer = ns.get("ddp_model"), ns.get("optimizer")
    model: Any = getattr(ddp_model, "module", ddp_model)
    saved_model = ckpt.get("model")
    if isinstance(saved_model, dict) and model is not None:
        current = model.state_dict()
        out["model_matches"] = saved_model.keys() == current.keys() and all(
            torch.equal(saved_model[k], current[k].cpu()) for k in current
        )
    saved_optimizer = ckpt.get("optimizer")
    if isinstance(saved_optimizer, dict) and optimizer is not None:
        buffers = [s.get("momentum_buffer") for s in saved_optimizer.get("state", {}).values()]
        current_buffers = [optimizer.state[p]["momentum_buffer"].cpu() for p in model.parameters()]
        out["optimizer_matches"] = len(buffers) == len(current_buffers) and all(
            b is not None and torch.equal(b, c) for b, c in zip(buffers, current_buffers, strict=True)
        )
    if isinstance(ckpt.get("scaler"), dict):
        out["scale"] = ckpt["scaler"].get("scale")
    states = ckpt.get("rng")
    if isinstance(states, list):
        out["rng_draws"] = [
            _draw_float(s["torch"]) if isinstance(s, dict) and "torch" in s else None for s in states
        ]
        out["loader_draws"] = [
            _seeds(s["loader"])[0] if isinstance(s, dict) and "loader" in s else None for s in states
        ]
    return out


def _save_expected(world: int) -> Seen:
    rows: Seen = [{"saved": 0, "ends at a barrier": True} for _ in range(world)]
    rows[0].update(
        {
            "saved": 1,
            "files": ["last.pt"],  # no temporary file left beside it
            "replaced": True,  # a new file renamed over the old: a new inode
            "missing_keys": [],
            "epoch": SAVE_EPOCH,
            "batch_in_epoch": SAVE_BATCH,
            "model_matches": True,
            "optimizer_matches": True,
            "scale": SAVE_SCALE,
            # each rank's global generator, seeded 1000 + rank: its next torch.rand
            "rng_draws": [_draw_float(SAVE_RNG_SEED + r) for r in range(world)],
            # each rank's loader generator before the epoch's iter(): the first seed it gives
            "loader_draws": [_seeds(SAVE_LOADER_SEED + r)[0] for r in range(world)],
        }
    )
    return rows


def _new_content(seen: Seen) -> bool:
    return seen[0].get("epoch") == SAVE_EPOCH and seen[0].get("batch_in_epoch") == SAVE_BATCH


def _written(seen: Seen) -> bool:
    return bool(seen[0].get("replaced")) or _new_content(seen)


SAVE = Exercise(
    id="04-save",
    notebook="04",
    title="Save everything an exact resume needs, atomically, from rank 0",
    task="Gather every rank's random states; rank 0 alone saves the checkpoint to `path` atomically "
    "(a temporary file, then `os.replace`); every rank waits. The checker runs it as 2 nodes.",
    starter=(
        "mine = ...  # TODO: this rank's random states, as a dict\n"
        "states = [None] * world_size\n"
        "# TODO: gather every rank's `mine` into `states`\n"
        "if rank == 0:\n"
        "    ckpt = {\n"
        '        "model": ddp_model.module.state_dict(),\n'
        "        # TODO: optimizer, scaler, epoch, batch_in_epoch, rng\n"
        "    }\n"
        "    torch.save(ckpt, path)  # TODO: atomically\n"
        "# TODO: no rank runs ahead of the write\n"
    ),
    reference=(
        'mine = {"torch": torch.get_rng_state(), "loader": generator_at_epoch_start}  # this rank\'s random state\n'
        "states = [None] * world_size\n"
        "dist.all_gather_object(states, mine)  # every rank must call it: each sends its own\n"
        "if rank == 0:  # one writer\n"
        "    ckpt = {\n"
        '        "model": ddp_model.module.state_dict(),  # plain keys\n'
        '        "optimizer": optimizer.state_dict(),  # the momentum buffers\n'
        '        "scaler": scaler.state_dict(),  # the loss scale\n'
        '        "epoch": epoch,\n'
        '        "batch_in_epoch": batch_in_epoch,  # the batches of this epoch already trained\n'
        '        "rng": states,  # one entry per rank, in rank order\n'
        "    }\n"
        '    tmp = f"{path}.{os.getpid()}.tmp"  # in the same folder: the rename stays on one filesystem\n'
        '    with open(tmp, "wb") as f:\n'
        "        torch.save(ckpt, f)\n"
        "        f.flush()\n"
        "        os.fsync(f.fileno())  # the bytes reach the disk before the name does\n"
        "    os.replace(tmp, path)  # atomic: a reader sees the old file or the new, never half of one\n"
        "dist.barrier()  # no rank runs ahead while rank 0 writes\n"
    ),
    hint="Every rank joins the gather; rank 0 writes a temporary file beside `path`, then renames it over.",
    setup=_save_setup,
    observe=_save_observe,
    expected=_save_expected,
    mistakes=(
        Mistake(
            "04-save-local-rank-writer",
            "Two ranks wrote the checkpoint, one per node: `local_rank == 0` holds once per node.",
            _first_of_each_node("saved"),
            hint="Write under `if rank == 0:`: RANK counts over every node.",
        ),
        Mistake(
            "04-save-every-rank-writes",
            "A rank other than 0 called torch.save: N writers of one checkpoint race.",
            lambda seen, expected: len(seen) > 1 and any(s.get("saved") for s in seen[1:]),
            hint="Put the torch.save and the os.replace under `if rank == 0:`, rank being RANK.",
        ),
        Mistake(
            "04-save-not-replaced",
            "The new checkpoint never reached `path`: a temporary file is left, `path` holds the old one.",
            lambda seen, expected: (
                seen[0].get("files", ["last.pt"]) != ["last.pt"] and not _new_content(seen)
            ),
            hint="After torch.save to the temporary file, call os.replace(tmp, path).",
        ),
        Mistake(
            "04-save-in-place",
            "The checkpoint was written into the old file (same inode): a kill mid-write leaves neither.",
            lambda seen, expected: seen[0].get("replaced") is False and _new_content(seen),
            hint="torch.save to a temporary file in the same folder, then os.replace(tmp, path).",
        ),
        Mistake(
            "04-save-incomplete",
            "The checkpoint lacks a part an exact resume needs (missing_keys).",
            lambda seen, expected: bool(seen[0].get("missing_keys")) and _written(seen),
            hint="Save optimizer and scaler state_dict()s, epoch, batch_in_epoch and rng.",
        ),
        Mistake(
            "04-save-rank0-rng-only",
            "The checkpoint holds rank 0's random state only; each rank needs its own back.",
            lambda seen, expected: (
                len(seen) > 1
                and bool(seen[0].get("rng_draws"))
                and all(d == expected[0]["rng_draws"][0] for d in seen[0]["rng_draws"])
            ),
            hint="Every rank calls dist.all_gather_object(states, mine), outside `if rank == 0:`.",
        ),
        Mistake(
            "04-save-generator-after-iter",
            "The saved loader state is the one after this epoch's iter(loader): a resume draws the next seed.",
            lambda seen, expected: (
                seen[0].get("loader_draws") == [_seeds(SAVE_LOADER_SEED + r, 2)[1] for r in range(len(seen))]
            ),
            hint="Save generator_at_epoch_start, not the generator's state now.",
        ),
        Mistake(
            "04-save-no-barrier",
            "No rank waited at a barrier after the save: the others run ahead while rank 0 writes.",
            lambda seen, expected: (
                len(seen) > 1 and _written(seen) and all(not s.get("ends at a barrier") for s in seen)
            ),
            hint="End with dist.barrier() on every rank, after the `if rank == 0:` block.",
        ),
    ),
    nodes=2,
    covers=(
        "save-module",
        "save-optimizer",
        "save-scaler",
        "save-position",
        "save-rng",
        "save-loader-generator",
        "rank0-writes",
        "atomic-write",
        "barrier-after-save",
    ),
)


# ------------------------------------------------------------------ 04-choose
CHOOSE_WIDTH = 4
CHOOSE_STEPS = (2, 4)  # the checkpoints in the folder; rank 0 sees both, the others only step 2


def _choose_setup(ctx: Context) -> dict[str, Any]:
    import os

    import torch
    import torch.distributed as dist

    folder = os.path.join(ctx.workdir, "checkpoints")
    paths = [os.path.join(folder, f"ckpt-step{step:08d}.pt") for step in CHOOSE_STEPS]
    if ctx.rank == 0:
        os.makedirs(folder, exist_ok=True)
        for step, path in zip(CHOOSE_STEPS, paths, strict=True):
            weight = torch.full((1, CHOOSE_WIDTH), float(step), dtype=torch.float64)
            torch.save({"model": {"weight": weight}, "step": step}, path)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # the files exist before any rank's answer runs
    seen_here = paths if ctx.rank == 0 else paths[:-1]  # the newest has not reached this rank's view yet

    def list_checkpoints() -> list[str]:
        return list(seen_here)

    model = torch.nn.Linear(CHOOSE_WIDTH, 1, bias=False, dtype=torch.float64).to(ctx.device)
    with torch.no_grad():
        model.weight.fill_(-1.0 - ctx.rank)  # each rank's own fresh weights
    return {"model": model, "list_checkpoints": list_checkpoints}


def _choose_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import torch

    # on the CPU every tensor lands on the CPU anyway: only the call's arguments show a missing map_location
    loads = ns.get("_loads_mapped") or []
    out: dict[str, Any] = {"torch.load given a map_location": bool(loads) and all(loads)}
    ckpt = ns.get("ckpt")
    if isinstance(ckpt, dict):
        out["step"] = ckpt.get("step")
        tensors = list(ckpt.get("model", {}).values())
        out["on_own_device"] = bool(tensors) and all(t.device == ctx.device for t in tensors)
    out["is_ddp"] = isinstance(ns.get("ddp_model"), torch.nn.parallel.DistributedDataParallel)
    return {**out, **_weight_of(ns)}


def _weight_of(ns: dict[str, Any]) -> dict[str, Any]:
    """{"weight": the wrapped model's weights, flat}, or {} where the answer left no wrapped model."""
    plain = getattr(ns.get("ddp_model"), "module", None)
    return {} if plain is None else {"weight": plain.weight.detach().cpu().flatten().tolist()}


def _choose_expected(world: int) -> Seen:
    newest = CHOOSE_STEPS[-1]
    return [
        {
            "step": newest,
            "on_own_device": True,
            "torch.load given a map_location": True,
            "is_ddp": True,
            "weight": [float(newest)] * CHOOSE_WIDTH,
        }
        for _ in range(world)
    ]


def _each_rank_chose(seen: Seen, expected: Seen) -> bool:
    steps = field_of(seen, "step")
    return len(seen) > 1 and steps[0] == CHOOSE_STEPS[-1] and any(s == CHOOSE_STEPS[0] for s in steps[1:])


def _broadcast_unused(seen: Seen, expected: Seen) -> bool:
    told = all(any("broadcast" in c for c in s.get("collectives") or []) for s in seen)
    return told and _each_rank_chose(seen, expected)


def _loaded_into_wrapper(seen: Seen, expected: Seen) -> bool:
    errors = [s.get("error") or "" for s in seen]
    return any("module." in e and "Missing key" in e for e in errors)


CHOOSE = Exercise(
    id="04-choose",
    notebook="04",
    title="Rank 0 chooses the checkpoint; every rank loads it, then wraps",
    task="Let rank 0's choice reach every rank, load it as `ckpt` onto `device`, put it into `model`, then "
    "wrap it as `ddp_model`.",
    starter=(
        "newest = list_checkpoints()[-1]\n"
        "# TODO: every rank takes rank 0's choice\n"
        "ckpt = torch.load(newest, weights_only=True)  # TODO: onto this rank's device\n"
        "ddp_model = ...  # TODO: the weights in first, then the wrap\n"
    ),
    reference=(
        "newest = list_checkpoints()[-1]  # this rank's listing: the ranks' can differ\n"
        "choice = [newest]  # rank 0's entry is the one that counts\n"
        "dist.broadcast_object_list(choice, src=0)  # rank 0 chooses: every rank gets its choice\n"
        "ckpt = torch.load(choice[0], map_location=device, weights_only=True)  # onto this rank's device\n"
        'model.load_state_dict(ckpt["model"])  # into the raw model: plain keys\n'
        'ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)  # then wrap\n'
    ),
    hint="Rank 0 chooses and broadcasts (`dist.broadcast_object_list`); load into the raw model, then wrap.",
    setup=_choose_setup,
    observe=_choose_observe,
    expected=_choose_expected,
    mistakes=(
        Mistake(
            "04-choose-broadcast-unused",
            "A broadcast ran, yet the ranks resumed from different steps: each loaded its own listing's newest.",
            _broadcast_unused,
            hint="Load choice[0], the broadcast value, not `newest`.",
        ),
        Mistake(
            "04-choose-each-rank",
            "The ranks resumed from different checkpoints (step): each chose from its own listing.",
            _each_rank_chose,
            hint="Put `newest` in a list, broadcast_object_list(it, src=0), load what it then holds.",
        ),
        Mistake(
            "04-choose-no-map-location",
            "torch.load had no map_location: on GPUs every rank would load rank 0's tensors onto GPU 0.",
            lambda seen, expected: all(
                s.get("step") == e["step"] and s.get("torch.load given a map_location") is False
                for s, e in zip(seen, expected, strict=True)
            ),
            hint="Give torch.load map_location=device.",
        ),
        Mistake(
            "04-choose-into-wrapper",
            "The plain keys went into the DDP wrapper, whose keys start with 'module.'.",
            _loaded_into_wrapper,
            hint='Load ckpt["model"] into the raw `model` first, then wrap it in DDP.',
        ),
    ),
    covers=("rank0-chooses", "load-map-location", "load-before-wrap"),
)


# ------------------------------------------------------------------ 04-resume
RESUME_SIZE = 12  # samples, one-hot of their index: 1, 2, 3, 4, 6 and 12 ranks divide it
RESUME_EPOCHS = 3
RESUME_EPOCH, RESUME_BATCH = 1, 1  # the checkpoint: epoch 1, its first batch trained
RESUME_SEED = 5  # every rank seeds seed + rank: its global generator and its loader's
RESUME_LR, RESUME_MOMENTUM = 1.0, 0.9


def _seeded(world: int) -> list[Any]:
    """Every rank's generator as a job seeds it: seed + rank."""
    import torch

    return [torch.Generator().manual_seed(RESUME_SEED + r) for r in range(world)]


def simulate(
    world: int,
    *,
    restore_optimizer: bool = True,
    restore_rng: bool = True,
    rng_of_rank0: bool = False,
    loader_generator: bool = True,
    restore_loader: bool = True,
    skip_done: bool = True,
    skip_every_epoch: bool = False,
) -> dict[str, Any]:
    """The run to the checkpoint, then the resumed run, in plain torch math: the checkpoint and, per rank,
    what the resume did. Each flag makes one piece of the resume wrong, as a wrong answer would."""
    import torch

    steps = -(-RESUME_SIZE // world)  # DistributedSampler pads to a multiple of the world
    orders = [[sampler_order(RESUME_SIZE, world, r, e) for r in range(world)] for e in range(RESUME_EPOCHS)]
    global_rng, loader_rng = _seeded(world), _seeded(world)
    weight = buffer = torch.zeros(RESUME_SIZE, dtype=torch.float64)
    ranks: list[dict[str, Any]] = [
        {"trained": [], "batches_per_epoch": {}, "masks": []} for _ in range(world)
    ]

    def step(epoch: int, batch: int, record: bool) -> None:
        nonlocal weight, buffer
        grad = torch.zeros(RESUME_SIZE, dtype=torch.float64)
        for r, row in enumerate(ranks):
            mask = (torch.rand(RESUME_SIZE, dtype=torch.float64, generator=global_rng[r]) < 0.5).double()
            index = orders[epoch][r][batch]
            grad[index] += mask[index] / world  # the gradient of w . (x * mask) for one-hot x
            if record:
                row["trained"].append(index)
                per_epoch = row["batches_per_epoch"]  # "epoch E" -> batches trained
                per_epoch[f"epoch {epoch}"] = per_epoch.get(f"epoch {epoch}", 0) + 1
                row["masks"].append("".join(str(int(m)) for m in mask.tolist()))
        buffer = RESUME_MOMENTUM * buffer + grad
        weight = weight - RESUME_LR * buffer

    for epoch in range(RESUME_EPOCH + 1):  # the first run, to the checkpoint
        loader_at_epoch_start = [g.get_state() for g in loader_rng]
        [_seeds(g) for g in loader_rng]  # iter(loader): one number for its workers' base seed
        for batch in range(steps if epoch < RESUME_EPOCH else RESUME_BATCH):
            step(epoch, batch, record=False)
    rng = [g.get_state() for g in global_rng]
    ckpt: dict[str, Any] = {"weight": weight, "buffer": buffer, "rng": rng, "loader": loader_at_epoch_start}
    global_rng[:], loader_rng = _seeded(world), _seeded(world)  # the new job seeds as the first did
    for r in range(world):
        if restore_rng:
            global_rng[r].set_state(ckpt["rng"][0 if rng_of_rank0 else r])
        if restore_loader:
            loader_rng[r].set_state(ckpt["loader"][r])
    buffer = buffer if restore_optimizer else torch.zeros_like(buffer)  # the momentum, or none
    for epoch in range(RESUME_EPOCH, RESUME_EPOCHS):  # the resumed run
        [_seeds(g) for g in (loader_rng if loader_generator else global_rng)]
        first = RESUME_BATCH if (epoch == RESUME_EPOCH or skip_every_epoch) and skip_done else 0
        for batch in range(first, steps):
            step(epoch, batch, record=True)
    for row, g in zip(ranks, loader_rng, strict=True):
        row.update(weight=weight.tolist(), next_seed=_seeds(g)[0] if loader_generator else None)
    return {"checkpoint": ckpt, "ranks": ranks}


def _resume_setup(ctx: Context) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DistributedSampler, TensorDataset

    device = ctx.device
    saved = simulate(ctx.world_size)["checkpoint"]
    model = torch.nn.Linear(RESUME_SIZE, 1, bias=False, dtype=torch.float64).to(device)
    with torch.no_grad():
        model.weight.copy_(saved["weight"].view(1, -1))  # 04-choose loaded it before the wrap
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=RESUME_LR, momentum=RESUME_MOMENTUM)
    ckpt = {  # as torch.load(..., map_location=device) gives it: every tensor on this rank's device
        "model": {"weight": saved["weight"].view(1, -1).to(device)},
        "optimizer": {
            "state": {0: {"momentum_buffer": saved["buffer"].view(1, -1).to(device)}},
            "param_groups": optimizer.state_dict()["param_groups"],  # the same lr and momentum
        },
        "epoch": RESUME_EPOCH,
        "batch_in_epoch": RESUME_BATCH,
        "rng": [
            {"torch": t.to(device), "loader": g.to(device)}
            for t, g in zip(saved["rng"], saved["loader"], strict=True)
        ],
    }
    dataset = TensorDataset(torch.eye(RESUME_SIZE, dtype=torch.float64), torch.arange(RESUME_SIZE))
    sampler: DistributedSampler[Any] = DistributedSampler(dataset)
    done: dict[str, Any] = {"trained": [], "batches_per_epoch": {}, "masks": []}  # as simulate's ranks

    def train_step(x: Any, y: Any) -> None:
        mask = (torch.rand(RESUME_SIZE, dtype=torch.float64) < 0.5).double()
        optimizer.zero_grad()
        ddp_model(x.to(device) * mask.to(device)).sum().backward()
        optimizer.step()
        done["trained"].append(int(y.item()))
        per_epoch, key = done["batches_per_epoch"], f"epoch {sampler.epoch}"  # set_epoch's last epoch
        per_epoch[key] = per_epoch.get(key, 0) + 1
        done["masks"].append("".join(str(int(m)) for m in mask.tolist()))

    torch.manual_seed(RESUME_SEED + ctx.rank)  # a fresh job seeds as the first one did
    return {
        "ckpt": ckpt,
        "ddp_model": ddp_model,
        "optimizer": optimizer,
        "dataset": dataset,
        "sampler": sampler,
        "train_step": train_step,
        "epochs": RESUME_EPOCHS,
        "seed": RESUME_SEED,
        "_done": done,
    }


def _resume_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {**copy.deepcopy(ns["_done"]), **_weight_of(ns)}
    generator = getattr(ns.get("loader"), "generator", None)
    out["next_seed"] = None if generator is None else _seeds(generator.get_state())[0]
    return out


def _resume_expected(world: int) -> Seen:
    return simulate(world)["ranks"]


def _like(name: str, **wrong: bool) -> Any:
    """Every rank's `name` is what the resume with one piece wrong gives."""

    def matches(seen: Seen, expected: Seen) -> bool:
        variant = simulate(len(seen), **wrong)["ranks"]
        same = close if name == "weight" else lambda a, b: bool(a == b)
        return all(same(s.get(name), v[name]) for s, v in zip(seen, variant, strict=True))

    return matches


def _from_epoch_0(seen: Seen, expected: Seen) -> bool:
    world = len(seen)
    for rank, s in enumerate(seen):
        order = sampler_order(RESUME_SIZE, world, rank, 0)
        trained = list(s.get("trained") or [])
        whole, skipped = order, order[RESUME_BATCH:]
        if trained[: len(whole)] != whole and trained[: len(skipped)] != skipped:
            return False
    return True


RESUME = Exercise(
    id="04-resume",
    notebook="04",
    title="Resume mid-epoch, as if nothing had happened",
    task="Build `loader` with a generator seeded `seed + rank`, restore the optimizer and this rank's random "
    "states, and train from the checkpoint's epoch, skipping the batches already trained.",
    starter=(
        "generator = torch.Generator().manual_seed(seed + rank)\n"
        "loader = DataLoader(dataset, batch_size=1, sampler=sampler)  # TODO: its own generator\n"
        "# TODO: restore the optimizer, this rank's random state, the loader generator's state\n"
        "for epoch in range(epochs):  # TODO: from the checkpoint's epoch\n"
        "    sampler.set_epoch(epoch)\n"
        "    for i, (x, y) in enumerate(loader):\n"
        "        # TODO: skip what the resumed epoch already trained\n"
        "        train_step(x, y)\n"
    ),
    reference=(
        "generator = torch.Generator().manual_seed(seed + rank)  # the checkpoint's state replaces it below\n"
        "loader = DataLoader(dataset, batch_size=1, sampler=sampler, generator=generator)  # iter() draws from it\n"
        'optimizer.load_state_dict(ckpt["optimizer"])  # the momentum buffers\n'
        'mine = ckpt["rng"][rank]  # this rank\'s own states\n'
        'torch.set_rng_state(mine["torch"].cpu())  # a CPU ByteTensor, wherever map_location put it\n'
        'generator.set_state(mine["loader"].cpu())  # as it was before the epoch\'s iter(loader)\n'
        'for epoch in range(ckpt["epoch"], epochs):\n'
        "    sampler.set_epoch(epoch)\n"
        '    done = ckpt["batch_in_epoch"] if epoch == ckpt["epoch"] else 0  # only in the resumed epoch\n'
        "    for i, (x, y) in enumerate(loader):\n"
        "        if i < done:  # trained before the checkpoint\n"
        "            continue\n"
        "        train_step(x, y)\n"
    ),
    hint="Put back the momentum, this rank's generator, the loader's generator, and the epoch and batch.",
    setup=_resume_setup,
    observe=_resume_observe,
    expected=_resume_expected,
    mistakes=(
        Mistake(
            "04-resume-epoch-restarted",
            "The resumed epoch trained its first batches again (trained).",
            _like("trained", skip_done=False),
            hint='In the checkpoint\'s epoch, `continue` while `i < ckpt["batch_in_epoch"]`.',
        ),
        Mistake(
            "04-resume-skip-every-epoch",
            "Every epoch after the resume skipped batches, not only the resumed one (batches_per_epoch).",
            _like("trained", skip_every_epoch=True),
            hint='Skip only when epoch == ckpt["epoch"].',
        ),
        Mistake(
            "04-resume-from-epoch-0",
            "The resumed run began again with epoch 0's batches (trained).",
            _from_epoch_0,
            hint='Start the loop at the checkpoint\'s epoch: `for epoch in range(ckpt["epoch"], epochs)`.',
        ),
        Mistake(
            "04-resume-rank0-rng",
            "Every rank drew rank 0's dropout masks: each restored rank 0's random state.",
            lambda seen, expected: len(seen) > 1 and _like("masks", rng_of_rank0=True)(seen, expected),
            hint='Restore ckpt["rng"][rank], each rank its own.',
        ),
        Mistake(
            "04-resume-rng-not-restored",
            "The dropout masks after the resume are a fresh job's: the random state was not restored.",
            _like("masks", restore_rng=False),
            hint='torch.set_rng_state(ckpt["rng"][rank]["torch"].cpu()), after any torch.manual_seed.',
        ),
        Mistake(
            "04-resume-no-loader-generator",
            "Every mask is shifted by one draw: without generator=, iter(loader) drew from the global generator.",
            _like("masks", loader_generator=False),
            hint="Build the loader with `generator=generator` and restore its state before the loop.",
        ),
        Mistake(
            "04-resume-loader-not-restored",
            "The loader's generator goes on from its fresh seed, not from the checkpoint.",
            _like("next_seed", restore_loader=False),
            hint='generator.set_state(ckpt["rng"][rank]["loader"].cpu()).',
        ),
        Mistake(
            "04-resume-no-optimizer",
            "The weights part from the uninterrupted run's at once: the momentum was not restored.",
            _like("weight", restore_optimizer=False),
            hint="Load the optimizer's saved state_dict before the first step.",
        ),
    ),
    covers=("restore-rng", "skip-done-batches", "loader-generator"),
    timeout_s=60.0,
)


EXERCISES = (SAVE, CHOOSE, RESUME)
