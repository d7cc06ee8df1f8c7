"""Notebook 04: choose (see the package's docstring)."""

from __future__ import annotations

from typing import Any

from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, field_of

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

    # on the CPU every tensor lands on the CPU anyway: only the call's arguments show a missing map_location
    loads = ns.get("_loads_mapped") or []
    out: dict[str, Any] = {"torch.load given a map_location": bool(loads) and all(loads)}
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
    """The choice was broadcast, yet the ranks loaded different steps: each loaded its own listing's."""
    told = all(any("broadcast" in c for c in s.get("collectives") or []) for s in seen)
    return told and _each_rank_chose(seen, expected)


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
            "04-choose-broadcast-unused",
            "rank 0's choice reached every rank (a broadcast ran), yet the ranks resumed from different "
            "steps: each then loaded the newest of its own listing. Load the broadcast value, the one "
            "rank 0 put in the list",
            _broadcast_unused,
            hint="After dist.broadcast_object_list(choice, src=0), load the list's entry, choice[0], which now "
            "holds rank 0's path on every rank; `newest` is still this rank's own listing.",
        ),
        Mistake(
            "04-choose-each-rank",
            "the ranks resumed from different checkpoints (step, below): each chose from its own listing. "
            "DDP's wrap gives every rank rank 0's weights, but the optimizer, the position and the random "
            "states come from different steps. Let rank 0 choose and broadcast its choice",
            _each_rank_chose,
            hint="Put `newest` in a list, call dist.broadcast_object_list(that list, src=0) on every rank, and "
            "load the path the list then holds: rank 0's.",
        ),
        Mistake(
            "04-choose-no-map-location",
            "every rank loaded the right checkpoint, but torch.load had no map_location: it then puts each "
            "tensor back on the device it was saved from, so on GPUs every rank loads rank 0's cuda:0 tensors "
            "onto GPU 0 (memory there, and a copy later). On the CPU nothing shows but the call itself: give "
            "map_location=device",
            lambda seen, expected: all(
                s.get("step") == e["step"] and s.get("torch.load given a map_location") is False
                for s, e in zip(seen, expected, strict=True)
            ),
            hint="Give torch.load map_location=device: each rank's tensors then land on its own device, "
            "whatever device they were saved from.",
        ),
        Mistake(
            "04-choose-into-wrapper",
            "the checkpoint's plain keys went into the DDP wrapper, whose keys start with 'module.': load "
            "into the raw model, before DDP(...) wraps it",
            _loaded_into_wrapper,
            hint='Load ckpt["model"] into the raw `model` first (its load_state_dict); only then wrap it, '
            "ddp_model = DDP(model, ...), which copies rank 0's weights to every rank.",
        ),
    ),
    covers=("rank0-chooses", "load-map-location", "load-before-wrap"),
)
