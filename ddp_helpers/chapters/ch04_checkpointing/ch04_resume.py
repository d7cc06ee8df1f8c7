"""Notebook 04: resume (see the package's docstring)."""

from __future__ import annotations

from typing import Any

from ddp_helpers.chapters.ch01_first_program.ch01_exercises import sampler_order
from ddp_helpers.chapters.ch04_checkpointing.ch04_save import _draw_seed
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen

# ------------------------------------------------------------------ 04-resume
RESUME_SIZE = 12  # samples, one-hot of their index: 1, 2, 3, 4, 6 and 12 ranks divide it
RESUME_EPOCHS = 3
RESUME_EPOCH, RESUME_BATCH = 1, 1  # the checkpoint: epoch 1, its first batch trained
RESUME_SEED = 5  # every rank seeds seed + rank: its global generator and its loader's
RESUME_LR, RESUME_MOMENTUM = 1.0, 0.9


class _Run:
    """The uninterrupted run's state on every rank, stepped in plain torch math (see `simulate`)."""

    def __init__(self, world: int) -> None:
        import torch

        self.torch, self.world = torch, world
        self.steps = -(-RESUME_SIZE // world)  # DistributedSampler pads to a multiple of the world
        self.global_rng = [torch.Generator().manual_seed(RESUME_SEED + r) for r in range(world)]
        self.loader_rng = [torch.Generator().manual_seed(RESUME_SEED + r) for r in range(world)]
        self.weight = torch.zeros(RESUME_SIZE, dtype=torch.float64)
        self.buffer = torch.zeros(RESUME_SIZE, dtype=torch.float64)
        self.trained: list[list[int]] = [[] for _ in range(world)]
        self.per_epoch: list[dict[str, int]] = [{} for _ in range(world)]  # "epoch E" -> batches trained
        self.masks: list[list[str]] = [[] for _ in range(world)]
        self.orders = [
            [sampler_order(RESUME_SIZE, world, r, e) for r in range(world)] for e in range(RESUME_EPOCHS)
        ]

    def draw_seed(self, generators: list[Any]) -> None:
        for g in generators:  # iter(loader): one number for its workers' base seed
            self.torch.empty((), dtype=self.torch.int64).random_(generator=g)

    def step(self, epoch: int, batch: int, record: bool) -> None:
        torch = self.torch
        grad = torch.zeros(RESUME_SIZE, dtype=torch.float64)
        for r in range(self.world):
            mask = (torch.rand(RESUME_SIZE, dtype=torch.float64, generator=self.global_rng[r]) < 0.5).double()
            index = self.orders[epoch][r][batch]
            grad[index] += mask[index] / self.world  # the gradient of w . (x * mask) for one-hot x
            if record:
                self.trained[r].append(index)
                key = f"epoch {epoch}"
                self.per_epoch[r][key] = self.per_epoch[r].get(key, 0) + 1
                self.masks[r].append("".join(str(int(m)) for m in mask.tolist()))
        self.buffer = RESUME_MOMENTUM * self.buffer + grad
        self.weight = self.weight - RESUME_LR * self.buffer

    def to_checkpoint(self) -> dict[str, Any]:
        """The first run, up to the checkpoint; what the checkpoint holds."""
        loader_at_epoch_start = [g.get_state() for g in self.loader_rng]
        for epoch in range(RESUME_EPOCH + 1):
            loader_at_epoch_start = [g.get_state() for g in self.loader_rng]
            self.draw_seed(self.loader_rng)
            for batch in range(self.steps if epoch < RESUME_EPOCH else RESUME_BATCH):
                self.step(epoch, batch, record=False)
        return {
            "weight": self.weight.clone(),
            "buffer": self.buffer.clone(),
            "rng": [g.get_state() for g in self.global_rng],
            "loader": loader_at_epoch_start,
        }


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
    from_epoch: int = RESUME_EPOCH,
) -> dict[str, Any]:
    """The run from the start to the checkpoint, then the resumed run, in plain torch math.

    Returns the checkpoint ("weight", "buffer", "rng", "loader": per-rank states) and, per rank, what the
    resumed run did: "trained" (sample indices), "batches_per_epoch" ("epoch E" -> batches trained), "masks"
    (one string of 0/1 a step), "weight" (final) and "next_seed" (the next number the loader's generator
    gives; None without one). The flags make one piece of the resume wrong, as a wrong answer would
    (`from_epoch`: the epoch the resumed loop starts at)."""
    import torch

    run = _Run(world)
    ckpt = run.to_checkpoint()
    if restore_rng:
        for r in range(world):
            run.global_rng[r].set_state(ckpt["rng"][0 if rng_of_rank0 else r])
    else:
        run.global_rng = [torch.Generator().manual_seed(RESUME_SEED + r) for r in range(world)]
    run.loader_rng = [torch.Generator().manual_seed(RESUME_SEED + r) for r in range(world)]
    if restore_loader:
        for r in range(world):
            run.loader_rng[r].set_state(ckpt["loader"][r])
    if not restore_optimizer:
        run.buffer = torch.zeros(RESUME_SIZE, dtype=torch.float64)
    for epoch in range(from_epoch, RESUME_EPOCHS):
        run.draw_seed(run.loader_rng if loader_generator else run.global_rng)
        first = RESUME_BATCH if (epoch == RESUME_EPOCH or skip_every_epoch) and skip_done else 0
        for batch in range(first, run.steps):
            run.step(epoch, batch, record=True)
    next_seed = [
        int(torch.empty((), dtype=torch.int64).random_(generator=g).item()) if loader_generator else None
        for g in run.loader_rng
    ]
    ranks = [
        {
            "trained": run.trained[r],
            "batches_per_epoch": run.per_epoch[r],
            "masks": run.masks[r],
            "weight": run.weight.tolist(),
            "next_seed": next_seed[r],
        }
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
    sampler: DistributedSampler[Any] = DistributedSampler(dataset)
    trained: list[int] = []
    per_epoch: dict[str, int] = {}
    masks: list[str] = []

    def train_step(x: Any, y: Any) -> None:
        """One step: a dropout-like mask from the global CPU generator, forward, backward, SGD step."""
        mask = (torch.rand(RESUME_SIZE, dtype=torch.float64) < 0.5).double()
        optimizer.zero_grad()
        ddp_model(x.to(device) * mask.to(device)).sum().backward()
        optimizer.step()
        trained.append(int(y.item()))
        key = f"epoch {sampler.epoch}"  # the epoch set_epoch last gave the sampler
        per_epoch[key] = per_epoch.get(key, 0) + 1
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
        "_per_epoch": per_epoch,
        "_masks": masks,
    }


def _resume_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {
        "trained": list(ns["_trained"]),
        "batches_per_epoch": dict(ns["_per_epoch"]),
        "masks": list(ns["_masks"]),
    }
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


def _from_epoch_0(seen: Seen, expected: Seen) -> bool:
    """Every rank's resumed run began with epoch 0's batches (whole, or less the checkpoint's done ones)."""
    world = len(seen)
    for rank, s in enumerate(seen):
        order = sampler_order(RESUME_SIZE, world, rank, 0)
        trained = list(s.get("trained") or [])
        whole, skipped = order, order[RESUME_BATCH:]
        if trained[: len(whole)] != whole and trained[: len(skipped)] != skipped:
            return False
    return True


def _same_as(name: str, **wrong: bool) -> Any:
    """As `_like`, for floats: to a tolerance."""
    from ddp_helpers.rank.spec import close

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
            hint='In the checkpoint\'s epoch, `continue` while `i < ckpt["batch_in_epoch"]`: those batches were '
            "trained before the checkpoint. Later epochs start at their first batch.",
        ),
        Mistake(
            "04-resume-skip-every-epoch",
            "every epoch after the resume skipped its first batch_in_epoch batches, not only the resumed "
            "epoch: each later epoch trained fewer batches than the sampler deals each rank "
            "(batches_per_epoch, below), and the samples skipped there are never trained",
            _like("trained", skip_every_epoch=True),
            hint="Skip only in the epoch the checkpoint was taken in: "
            '`done = ckpt["batch_in_epoch"] if epoch == ckpt["epoch"] else 0`, and `continue` while `i < done`; '
            "every later epoch starts at its first batch.",
        ),
        Mistake(
            "04-resume-from-epoch-0",
            "the resumed run began again with epoch 0's batches (trained, below): the loop started at epoch "
            "0, not at the checkpoint's epoch, so the epochs before the checkpoint are trained twice",
            _from_epoch_0,
            hint='Start the loop at the checkpoint\'s epoch: `for epoch in range(ckpt["epoch"], epochs)`.',
        ),
        Mistake(
            "04-resume-rank0-rng",
            "every rank drew rank 0's dropout masks: each rank restored rank 0's random state. "
            'Restore ckpt["rng"][rank], each its own',
            lambda seen, expected: len(seen) > 1 and _like("masks", rng_of_rank0=True)(seen, expected),
            hint='Index the saved states by this rank, `ckpt["rng"][rank]`: each rank drew its own masks, so '
            "each restores its own state.",
        ),
        Mistake(
            "04-resume-rng-not-restored",
            "the dropout masks after the resume are a fresh job's, not the uninterrupted run's: this rank's "
            "random state was not restored (torch.set_rng_state)",
            _like("masks", restore_rng=False),
            hint="Put this rank's saved state back with `torch.set_rng_state` (its "
            '`ckpt["rng"][rank]["torch"]`, on the CPU), after any `torch.manual_seed`: a reseed after it '
            "replaces the state it restored.",
        ),
        Mistake(
            "04-resume-no-loader-generator",
            "every mask after the resume is shifted by one draw: without generator=, the resumed epoch's "
            "iter(loader) took its seed from the global generator, one draw the uninterrupted run took "
            "before the checkpoint. Give the loader a generator of its own",
            _like("masks", loader_generator=False),
            hint="Build the loader with `generator=generator` (seeded `seed + rank`), and restore that "
            "generator's saved state before the loop.",
        ),
        Mistake(
            "04-resume-loader-not-restored",
            "the loader's generator goes on from its fresh seed, not from the checkpoint: its workers would "
            "get other seeds than in the uninterrupted run (and other random augmentations)",
            _like("next_seed", restore_loader=False),
            hint="Restore the loader generator's state too: "
            '`generator.set_state(ckpt["rng"][rank]["loader"].cpu())`, the state it had before the '
            "checkpoint's epoch drew from it.",
        ),
        Mistake(
            "04-resume-no-optimizer",
            "the weights leave the uninterrupted run's from the first step after the resume: the momentum "
            "buffers were not restored (optimizer.load_state_dict)",
            _same_as("weight", restore_optimizer=False),
            hint='Load the optimizer\'s saved state, `ckpt["optimizer"]`, with `optimizer.load_state_dict` '
            "before the first step: it holds the momentum buffers.",
        ),
    ),
    covers=("restore-rng", "skip-done-batches", "loader-generator"),
    timeout_s=60.0,
)
