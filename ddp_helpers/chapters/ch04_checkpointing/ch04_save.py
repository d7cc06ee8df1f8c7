"""Notebook 04: save (see the package's docstring)."""

from __future__ import annotations

from typing import Any

from ddp_helpers.chapters.ch01_first_program.ch01_shared import _first_of_each_node
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen

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
            _draw_seed(s["loader"]) if isinstance(s, dict) and "loader" in s else None for s in states
        ]
    return out


def _save_expected(world: int) -> Seen:
    import torch

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
        "Gather every rank's random state (`dist.all_gather_object`, or `dist.gather_object` to rank 0): a dict "
        '`{"torch": torch.get_rng_state(), "loader": generator_at_epoch_start}` from each rank, in rank order. '
        "Then rank 0 alone writes one checkpoint dict to `path`, with the keys `model` (the plain model's "
        "`state_dict()`), `optimizer`, `scaler`, `epoch`, `batch_in_epoch` and `rng` (the gathered list), "
        "atomically: `torch.save` to a temporary file in the same folder, then `os.replace` it over `path`. "
        "Every rank then waits at a barrier. On the CPU the checker runs your answer as the ranks of 2 nodes "
        "(`LOCAL_RANK` and `local_rank` as torchrun sets them there), where only one rank of the job has RANK 0."
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
            "04-save-local-rank-writer",
            "two ranks wrote the checkpoint, one per node (the probe ran as 2 nodes: rank 0 and the first rank "
            "of node 1, `saved` below): `local_rank == 0` holds for the first rank of every node, so a job of "
            "N nodes has N writers of one checkpoint, which race",
            _first_of_each_node("saved"),
            hint="Write under `if rank == 0:`: RANK counts the processes of every node, so one process of the "
            "job has RANK 0; LOCAL_RANK is 0 once per node. Every rank still joins the gather and the barrier.",
        ),
        Mistake(
            "04-save-every-rank-writes",
            "a rank other than 0 called torch.save: N writers of one checkpoint race, and the file can end up "
            "torn or one rank's; only rank 0 writes (RANK 0: LOCAL_RANK is 0 on the first rank of every node, "
            "so on every rank where each node holds one, as the probe's 2 nodes do at 2 ranks)",
            lambda seen, expected: len(seen) > 1 and any(s.get("saved") for s in seen[1:]),
            hint="Put the torch.save and the os.replace under `if rank == 0:`, rank being RANK (LOCAL_RANK is 0 "
            "on every node's first rank); every rank still joins the gather and the barrier.",
        ),
        Mistake(
            "04-save-not-replaced",
            "the new checkpoint never reached `path`: a temporary file is left in the folder, and `path` still "
            "holds the previous checkpoint. os.replace(tmp, path) puts it in place",
            lambda seen, expected: (
                seen[0].get("files", ["last.pt"]) != ["last.pt"] and not _new_content(seen)
            ),
            hint="After torch.save has written the temporary file, os.replace(tmp, path): the rename puts the "
            "new checkpoint at `path`, over the old one, and leaves no temporary file behind.",
        ),
        Mistake(
            "04-save-in-place",
            "the new checkpoint was written into the old file (its inode is the old one): a job killed during "
            "that write leaves neither the old checkpoint nor the new. Write a temporary file, then os.replace",
            lambda seen, expected: seen[0].get("replaced") is False and _new_content(seen),
            hint="torch.save to a temporary file in the same folder (a name of your own beside `path`), then "
            "os.replace(tmp, path): a reader then sees the old file or the new, never half of one.",
        ),
        Mistake(
            "04-save-incomplete",
            "the checkpoint lacks a part an exact resume needs (missing_keys, below): without the optimizer "
            "the momentum restarts, without the scaler the loss scale, without the position the epoch",
            lambda seen, expected: bool(seen[0].get("missing_keys")) and _written(seen),
            hint="Put each missing key in the dict: optimizer.state_dict(), scaler.state_dict(), epoch, "
            "batch_in_epoch, and under rng the gathered list.",
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
            hint="Every rank calls dist.all_gather_object(states, mine) (or gather_object to rank 0), outside "
            "the `if rank == 0:`; then rng holds `states`, one entry per rank, each rank's own.",
        ),
        Mistake(
            "04-save-generator-after-iter",
            "the loader generator's state in the checkpoint is the one after this epoch's iter(loader): a "
            "resume calls iter() again and would draw the next seed. Save the state kept before the iter()",
            lambda seen, expected: (
                seen[0].get("loader_draws") == [_seeds(SAVE_LOADER_SEED + r, 2)[1] for r in range(len(seen))]
            ),
            hint="Under loader, store generator_at_epoch_start, the state the loop kept before this epoch's "
            "iter(loader), not the generator's state now.",
        ),
        Mistake(
            "04-save-no-barrier",
            "no rank waited at a barrier after the save: the other ranks run ahead (to read the file, to "
            "resume, to exit) while rank 0 is still writing it",
            lambda seen, expected: (
                len(seen) > 1 and _written(seen) and all(not s.get("ends at a barrier") for s in seen)
            ),
            hint="End with dist.barrier() on every rank, after the `if rank == 0:` block (not in it: the "
            "other ranks would never reach it).",
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
