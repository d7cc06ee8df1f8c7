"""Notebook 04's exercises: save a checkpoint that resumes exactly, choose it on rank 0, and resume from it.

04-save: every rank's random state gathered, rank 0 alone writes the whole state to a temporary file that
`os.replace` puts over the previous checkpoint, then a barrier. The setup leaves an older checkpoint at
the path: `os.replace` gives the path a new inode, a write in place keeps the old one.
04-choose: each rank sees another listing of the folder (the newest file has not reached rank 1's view
yet); rank 0 chooses, every rank loads its choice onto its own device, into the raw model, then wraps.
04-resume: from a checkpoint written mid-epoch, the run must continue as the uninterrupted one did. The
uninterrupted run is written out here in plain torch math (`simulate`): a bias-free float64 Linear that
starts at zero, one-hot samples, a dropout-like mask drawn from the global CPU generator at each step,
SGD with momentum. Each missing piece of the resume (optimizer state, RNG, the loader's generator, the
skipped batches) moves the masks, the weights or the samples trained in its own way.
"""

from __future__ import annotations

from typing import Any

from .nb01 import sampler_order
from .spec import Context, Exercise, Mistake, Seen, field_of

# ------------------------------------------------------------------ 04-save
SAVE_EPOCH, SAVE_BATCH = 1, 3  # where the run stands when it saves: epoch 1, 3 batches of it trained
SAVE_RNG_SEED = 1000  # each rank's global generator: seed 1000 + rank
SAVE_LOADER_SEED = 2000  # each rank's loader generator: seed 2000 + rank
SAVE_SCALE = 1024.0  # the GradScaler's scale: not the default 65536, so a fresh scaler shows
SAVE_REQUIRED = ("model", "optimizer", "scaler", "epoch", "batch_in_epoch", "rng")
_previous_inode: dict[str, int] = {}  # rank 0: the older checkpoint's inode, by path


def _draw_float(state: Any) -> float:
    """The next torch.rand a generator in `state` gives (a fingerprint of the state)."""
    import torch

    generator = torch.Generator()
    generator.set_state(state.cpu())
    return torch.rand(1, dtype=torch.float64, generator=generator).item()


def _draw_seed(state: Any) -> int:
    """The next number a DataLoader's iter() takes from a generator in `state` (its workers' base seed)."""
    import torch

    generator = torch.Generator()
    generator.set_state(state.cpu())
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def _seeds(seed: int, count: int) -> list[int]:
    """The first `count` numbers a DataLoader's iter() calls draw from Generator().manual_seed(seed)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
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
    sampler = DistributedSampler(dataset)
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

    if ctx.rank != 0:
        return {}  # "saved" and "collectives" come from the observers
    path = ns["path"]
    out: dict[str, Any] = {"files": sorted(os.listdir(os.path.dirname(path)))}
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
    model = getattr(ddp_model, "module", ddp_model)
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
            _draw_seed(s["loader"]) if isinstance(s, dict) and "loader" in s else None for s in states
        ]
    return out


def _save_expected(world: int) -> Seen:
    import torch

    rows: Seen = [{"saved": 0, "collectives": ["all_gather_object", "barrier"]} for _ in range(world)]
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
            "rng_draws": [
                torch.rand(
                    1, dtype=torch.float64, generator=torch.Generator().manual_seed(SAVE_RNG_SEED + r)
                ).item()
                for r in range(world)
            ],
            # each rank's loader generator before the epoch's iter(): the first seed it gives
            "loader_draws": [_seeds(SAVE_LOADER_SEED + r, 1)[0] for r in range(world)],
        }
    )
    return rows


def _new_content(seen: Seen) -> bool:
    return seen[0].get("epoch") == SAVE_EPOCH and seen[0].get("batch_in_epoch") == SAVE_BATCH


def _written(seen: Seen) -> bool:
    """Something new is at `path`: a new file renamed there, or the new checkpoint written into the old."""
    return bool(seen[0].get("replaced")) or _new_content(seen)


SAVE = Exercise(
    id="04-save",
    notebook="04",
    title="Save everything an exact resume needs, atomically, from rank 0",
    task=(
        "Gather every rank's random state with `dist.all_gather_object`: a dict "
        '`{"torch": torch.get_rng_state(), "loader": generator_at_epoch_start}` from each rank, in rank order. '
        "Then rank 0 alone writes one checkpoint dict to `path`, with the keys `model` (the plain model's "
        "`state_dict()`), `optimizer`, `scaler`, `epoch`, `batch_in_epoch` and `rng` (the gathered list), "
        "atomically: `torch.save` to a temporary file in the same folder, then `os.replace` it over `path`. "
        "Every rank then waits at a barrier."
    ),
    given=(
        "`ddp_model`, `optimizer` (SGD with momentum, one step taken), `scaler` (a `GradScaler`), `loader`, "
        "`epoch` (1), `batch_in_epoch` (3), `generator_at_epoch_start` (the loader generator's state, kept "
        "before this epoch's `iter(loader)`), `path` (an older checkpoint is there)"
    ),
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
    hint=(
        "Every rank has its own random state, so every rank must take part in the gather; only rank 0 "
        "writes. A write straight to `path` leaves a torn file if the job dies in the middle: write a "
        "temporary file beside it, then rename it over `path`."
    ),
    setup=_save_setup,
    observe=_save_observe,
    expected=_save_expected,
    mistakes=(
        Mistake(
            "04-save-every-rank-writes",
            "a rank other than 0 called torch.save: N writers of one checkpoint race, and the file can end up "
            "torn or one rank's; only rank 0 writes",
            lambda seen, expected: len(seen) > 1 and any(s.get("saved") for s in seen[1:]),
        ),
        Mistake(
            "04-save-not-replaced",
            "the new checkpoint never reached `path`: a temporary file is left in the folder, and `path` still "
            "holds the previous checkpoint. os.replace(tmp, path) puts it in place",
            lambda seen, expected: (
                seen[0].get("files", ["last.pt"]) != ["last.pt"] and not _new_content(seen)
            ),
        ),
        Mistake(
            "04-save-in-place",
            "the new checkpoint was written into the old file (its inode is the old one): a job killed during "
            "that write leaves neither the old checkpoint nor the new. Write a temporary file, then os.replace",
            lambda seen, expected: seen[0].get("replaced") is False and _new_content(seen),
        ),
        Mistake(
            "04-save-incomplete",
            "the checkpoint lacks a part an exact resume needs (missing_keys, below): without the optimizer "
            "the momentum restarts, without the scaler the loss scale, without the position the epoch",
            lambda seen, expected: bool(seen[0].get("missing_keys")) and _written(seen),
        ),
        Mistake(
            "04-save-rank0-rng-only",
            "the checkpoint holds rank 0's random state only: every rank draws its own dropout masks, so each "
            "needs its own state back. Gather them all (every rank calls all_gather_object)",
            lambda seen, expected: (
                len(seen) > 1
                and bool(seen[0].get("rng_draws"))
                and all(d == expected[0]["rng_draws"][0] for d in seen[0]["rng_draws"])
            ),
        ),
        Mistake(
            "04-save-generator-after-iter",
            "the loader generator's state in the checkpoint is the one after this epoch's iter(loader): a "
            "resume calls iter() again and would draw the next seed. Save the state kept before the iter()",
            lambda seen, expected: (
                seen[0].get("loader_draws") == [_seeds(SAVE_LOADER_SEED + r, 2)[1] for r in range(len(seen))]
            ),
        ),
        Mistake(
            "04-save-no-barrier",
            "no rank waited at a barrier after the save: the other ranks run ahead (to read the file, to "
            "resume, to exit) while rank 0 is still writing it",
            lambda seen, expected: (
                len(seen) > 1
                and _written(seen)
                and all("barrier" not in (s.get("collectives") or []) for s in seen)
            ),
        ),
    ),
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
        """This rank's listing of the checkpoint folder, oldest first."""
        return list(seen_here)

    model = torch.nn.Linear(CHOOSE_WIDTH, 1, bias=False, dtype=torch.float64).to(ctx.device)
    with torch.no_grad():
        model.weight.fill_(-1.0 - ctx.rank)  # each rank's own fresh weights
    return {"model": model, "list_checkpoints": list_checkpoints}


def _choose_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    ckpt = ns.get("ckpt")
    if isinstance(ckpt, dict):
        out["step"] = ckpt.get("step")
        tensors = list(ckpt.get("model", {}).values())
        out["on_own_device"] = bool(tensors) and all(t.device == ctx.device for t in tensors)
    wrapped = ns.get("ddp_model")
    out["is_ddp"] = isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
    plain = getattr(wrapped, "module", None)
    if plain is not None:
        out["weight"] = plain.weight.detach().cpu().flatten().tolist()
    return out


def _choose_expected(world: int) -> Seen:
    newest = CHOOSE_STEPS[-1]
    return [
        {"step": newest, "on_own_device": True, "is_ddp": True, "weight": [float(newest)] * CHOOSE_WIDTH}
        for _ in range(world)
    ]


def _each_rank_chose(seen: Seen, expected: Seen) -> bool:
    steps = field_of(seen, "step")
    return len(seen) > 1 and steps[0] == CHOOSE_STEPS[-1] and any(s == CHOOSE_STEPS[0] for s in steps[1:])


def _loaded_into_wrapper(seen: Seen, expected: Seen) -> bool:
    errors = [s.get("error") or "" for s in seen]
    return any("module." in e and "Missing key" in e for e in errors)


CHOOSE = Exercise(
    id="04-choose",
    notebook="04",
    title="Rank 0 chooses the checkpoint; every rank loads it, then wraps",
    task=(
        "Resume from the newest checkpoint, the same on every rank: `list_checkpoints()` gives this rank's "
        "listing of the folder (oldest first), and the ranks' listings can differ. Let rank 0's choice reach "
        'every rank, load it as `ckpt` onto this rank\'s own `device`, put `ckpt["model"]` into the raw '
        "`model`, and only then wrap it in DDP as `ddp_model`."
    ),
    given="`model` (a plain `Linear`, its own weights on each rank), `list_checkpoints()`, `device`, `local_rank`",
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
    hint=(
        "A listing is this rank's view of the folder. One rank chooses and tells the others "
        "(`dist.broadcast_object_list`). The checkpoint holds plain keys, the raw model's: load before "
        "`DDP(...)`, which then starts every rank from rank 0's weights."
    ),
    setup=_choose_setup,
    observe=_choose_observe,
    expected=_choose_expected,
    mistakes=(
        Mistake(
            "04-choose-each-rank",
            "the ranks resumed from different checkpoints (step, below): each chose from its own listing. "
            "DDP's wrap gives every rank rank 0's weights, but the optimizer, the position and the random "
            "states come from different steps. Let rank 0 choose and broadcast its choice",
            _each_rank_chose,
        ),
        Mistake(
            "04-choose-into-wrapper",
            "the checkpoint's plain keys went into the DDP wrapper, whose keys start with 'module.': load "
            "into the raw model, before DDP(...) wraps it",
            _loaded_into_wrapper,
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


def simulate(
    world: int,
    *,
    restore_optimizer: bool = True,
    restore_rng: bool = True,
    rng_of_rank0: bool = False,
    loader_generator: bool = True,
    restore_loader: bool = True,
    skip_done: bool = True,
) -> dict[str, Any]:
    """The run from the start to the checkpoint, then the resumed run, in plain torch math.

    Returns the checkpoint ("weight", "buffer", "rng", "loader": per-rank states) and, per rank, what the
    resumed run did: "trained" (sample indices), "masks" (one string of 0/1 a step), "weight" (final) and
    "next_seed" (the next number the loader's generator gives; None without one). The flags make one
    piece of the resume wrong, as a wrong answer would."""
    import torch

    steps = -(-RESUME_SIZE // world)  # DistributedSampler pads to a multiple of the world
    width = RESUME_SIZE
    global_rng = [torch.Generator().manual_seed(RESUME_SEED + r) for r in range(world)]
    loader_rng = [torch.Generator().manual_seed(RESUME_SEED + r) for r in range(world)]
    weight = torch.zeros(width, dtype=torch.float64)
    buffer = torch.zeros(width, dtype=torch.float64)
    trained: list[list[int]] = [[] for _ in range(world)]
    masks: list[list[str]] = [[] for _ in range(world)]

    def epoch_start(rngs: list[Any]) -> None:
        for g in rngs:  # iter(loader): one number for its workers' base seed
            torch.empty((), dtype=torch.int64).random_(generator=g)

    orders = [[sampler_order(RESUME_SIZE, world, r, e) for r in range(world)] for e in range(RESUME_EPOCHS)]

    def step(epoch: int, batch: int, record: bool) -> None:
        nonlocal weight, buffer
        grad = torch.zeros(width, dtype=torch.float64)
        for r in range(world):
            mask = (torch.rand(width, dtype=torch.float64, generator=global_rng[r]) < 0.5).double()
            index = orders[epoch][r][batch]
            grad[index] += mask[index] / world  # the gradient of w . (x * mask) for one-hot x
            if record:
                trained[r].append(index)
                masks[r].append("".join(str(int(m)) for m in mask.tolist()))
        buffer = RESUME_MOMENTUM * buffer + grad
        weight = weight - RESUME_LR * buffer

    # the first run, up to the checkpoint
    loader_at_epoch_start = [g.get_state() for g in loader_rng]
    for epoch in range(RESUME_EPOCH + 1):
        loader_at_epoch_start = [g.get_state() for g in loader_rng]
        epoch_start(loader_rng)
        for batch in range(steps if epoch < RESUME_EPOCH else RESUME_BATCH):
            step(epoch, batch, record=False)
    ckpt = {
        "weight": weight.clone(),
        "buffer": buffer.clone(),
        "rng": [g.get_state() for g in global_rng],
        "loader": loader_at_epoch_start,
    }
    # the resumed run
    if restore_rng:
        for r in range(world):
            global_rng[r].set_state(ckpt["rng"][0 if rng_of_rank0 else r])
    else:
        global_rng = [torch.Generator().manual_seed(RESUME_SEED + r) for r in range(world)]
    loader_rng = [torch.Generator().manual_seed(RESUME_SEED + r) for r in range(world)]
    if restore_loader:
        for r in range(world):
            loader_rng[r].set_state(ckpt["loader"][r])
    if not restore_optimizer:
        buffer = torch.zeros(width, dtype=torch.float64)
    for epoch in range(RESUME_EPOCH, RESUME_EPOCHS):
        epoch_start(loader_rng if loader_generator else global_rng)
        first = RESUME_BATCH if epoch == RESUME_EPOCH and skip_done else 0
        for batch in range(first, steps):
            step(epoch, batch, record=True)
    next_seed = [
        int(torch.empty((), dtype=torch.int64).random_(generator=g).item()) if loader_generator else None
        for g in loader_rng
    ]
    ranks = [
        {"trained": trained[r], "masks": masks[r], "weight": weight.tolist(), "next_seed": next_seed[r]}
        for r in range(world)
    ]
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
    first_run = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=RESUME_LR, momentum=RESUME_MOMENTUM)
    ckpt = {  # as torch.load(..., map_location=device) gives it: every tensor on this rank's device
        "model": {"weight": saved["weight"].view(1, -1).to(device)},
        "optimizer": {
            "state": {0: {"momentum_buffer": saved["buffer"].view(1, -1).to(device)}},
            "param_groups": first_run.state_dict()["param_groups"],
        },
        "epoch": RESUME_EPOCH,
        "batch_in_epoch": RESUME_BATCH,
        "rng": [
            {"torch": t.to(device), "loader": g.to(device)}
            for t, g in zip(saved["rng"], saved["loader"], strict=True)
        ],
    }
    dataset = TensorDataset(torch.eye(RESUME_SIZE, dtype=torch.float64), torch.arange(RESUME_SIZE))
    sampler = DistributedSampler(dataset)
    trained: list[int] = []
    masks: list[str] = []

    def train_step(x: Any, y: Any) -> None:
        """One step: a dropout-like mask from the global CPU generator, forward, backward, SGD step."""
        mask = (torch.rand(RESUME_SIZE, dtype=torch.float64) < 0.5).double()
        optimizer.zero_grad()
        ddp_model(x.to(device) * mask.to(device)).sum().backward()
        optimizer.step()
        trained.append(int(y.item()))
        masks.append("".join(str(int(m)) for m in mask.tolist()))

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
        "_trained": trained,
        "_masks": masks,
    }


def _resume_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {"trained": list(ns["_trained"]), "masks": list(ns["_masks"])}
    plain = getattr(ns.get("ddp_model"), "module", None)
    if plain is not None:
        out["weight"] = plain.weight.detach().cpu().flatten().tolist()
    generator = getattr(ns.get("loader"), "generator", None)
    out["next_seed"] = None if generator is None else _draw_seed(generator.get_state())
    return out


def _resume_expected(world: int) -> Seen:
    return simulate(world)["ranks"]


def _like(name: str, **wrong: bool) -> Any:
    """A signature: every rank's `name` is what the resume with one piece wrong gives."""

    def matches(seen: Seen, expected: Seen) -> bool:
        variant = simulate(len(seen), **wrong)["ranks"]
        return all(s.get(name) == v[name] for s, v in zip(seen, variant, strict=True))

    return matches


def _same_as(name: str, **wrong: bool) -> Any:
    """As `_like`, for floats: to a tolerance."""
    from .spec import close

    def matches(seen: Seen, expected: Seen) -> bool:
        variant = simulate(len(seen), **wrong)["ranks"]
        return all(close(s.get(name), v[name], 1e-9) for s, v in zip(seen, variant, strict=True))

    return matches


RESUME = Exercise(
    id="04-resume",
    notebook="04",
    title="Resume mid-epoch, as if nothing had happened",
    task=(
        "`ckpt` was saved in epoch 1 after its first batch (04-save's format), and its weights are already "
        "in `ddp_model`. Build `loader` over `dataset` with `sampler` (batch size 1) and a `generator=` of "
        "its own, seeded `seed + rank`. Restore the optimizer, this rank's own random state and the loader "
        "generator's, then train from the checkpoint's epoch to `epochs`, calling `train_step(x, y)` on each "
        "batch, and skip the batches of the resumed epoch that were already trained. The checker compares "
        "each rank's samples, dropout masks and final weights with the run that was never interrupted."
    ),
    given=(
        "`ckpt` (keys `model`, `optimizer`, `epoch`, `batch_in_epoch`, `rng`: one "
        '`{"torch": ..., "loader": ...}` per rank, on `device` as `map_location` put them), `ddp_model`, '
        "`optimizer` (SGD with momentum, fresh), `dataset`, `sampler`, `train_step(x, y)` (draws a dropout "
        "mask from the global generator), `epochs` (3), `seed`"
    ),
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
    hint=(
        "An exact resume puts back every state the next steps read: the momentum, each rank's generator, "
        "the loader's generator, and the position (epoch and batch). Without `generator=`, `iter(loader)` "
        "draws its seed from the global generator, the one the dropout masks come from."
    ),
    setup=_resume_setup,
    observe=_resume_observe,
    expected=_resume_expected,
    mistakes=(
        Mistake(
            "04-resume-epoch-restarted",
            "the resumed epoch trained its first batches again (trained, below): skip the checkpoint's "
            "batch_in_epoch batches, in the resumed epoch only",
            _like("trained", skip_done=False),
        ),
        Mistake(
            "04-resume-rank0-rng",
            "every rank drew rank 0's dropout masks: each rank restored rank 0's random state. "
            'Restore ckpt["rng"][rank], each its own',
            lambda seen, expected: len(seen) > 1 and _like("masks", rng_of_rank0=True)(seen, expected),
        ),
        Mistake(
            "04-resume-rng-not-restored",
            "the dropout masks after the resume are a fresh job's, not the uninterrupted run's: this rank's "
            "random state was not restored (torch.set_rng_state)",
            _like("masks", restore_rng=False),
        ),
        Mistake(
            "04-resume-no-loader-generator",
            "every mask after the resume is shifted by one draw: without generator=, the resumed epoch's "
            "iter(loader) took its seed from the global generator, one draw the uninterrupted run took "
            "before the checkpoint. Give the loader a generator of its own",
            _like("masks", loader_generator=False),
        ),
        Mistake(
            "04-resume-loader-not-restored",
            "the loader's generator goes on from its fresh seed, not from the checkpoint: its workers would "
            "get other seeds than in the uninterrupted run (and other random augmentations)",
            _like("next_seed", restore_loader=False),
        ),
        Mistake(
            "04-resume-no-optimizer",
            "the weights leave the uninterrupted run's from the first step after the resume: the momentum "
            "buffers were not restored (optimizer.load_state_dict)",
            _same_as("weight", restore_optimizer=False),
        ),
    ),
    covers=("restore-rng", "skip-done-batches", "loader-generator"),
    timeout_s=60.0,
)

EXERCISES = (SAVE, CHOOSE, RESUME)
