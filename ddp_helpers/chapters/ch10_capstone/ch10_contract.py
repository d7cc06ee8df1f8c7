"""The capstone's contract in numbers: the sizes, the data file, the flags, and each mistake's hint.

No torch import at module level: check_script refuses bad input before torch loads.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ddp_helpers.rank.registry import CAPSTONE

EXERCISE = CAPSTONE  # "10-capstone": spelled once, in the registry

# ------------------------------------------------------------------ the contract's sizes
FEATURES, HIDDEN, CLASSES = 8, 16, 3
BATCH, EPOCHS = 4, 3
# SEED is not 0: a sampler left at its default seed (0) would deal the same order as a right one at seed 0
LR, MOMENTUM, CLIP, DROPOUT, SEED = 0.5, 0.9, 1.0, 0.25, 5
SHARD = 11  # samples per rank (the sampler pads one): batches of 4, 4 and 3, so three steps per epoch
STEPS_PER_EPOCH = math.ceil(SHARD / BATCH)
STOP_AT = STEPS_PER_EPOCH + 1  # the first step of epoch 1: the resumed run must go on with its second batch
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS
POISON = 1.0e5  # above float16's largest value (65504): cast to float16 it is inf
POISON_STEP = 2  # the last rank's second batch of epoch 0 holds the poisoned sample: before the stop
AMP_MODES = ("fp16", "bf16")  # the first world size checked runs --amp fp16, the next --amp bf16, ...
# (weights, loss): how far the weights may be from the replay's, relative to how far training moved them,
# and the logged loss from the replay's. The replay runs on the CPU: there it repeats the script's own
# operations, and only the order of the all-reduce's sums differs; a GPU rounds float16 and bfloat16 elsewhere
TOLERANCE = {
    ("cpu", "off"): (1e-5, 1e-5),
    ("cpu", "bf16"): (1e-3, 1e-4),
    ("cpu", "fp16"): (1e-3, 1e-4),
    ("cuda", "off"): (1e-3, 1e-4),
    ("cuda", "bf16"): (5e-2, 1e-2),
    ("cuda", "fp16"): (5e-2, 1e-2),
}
RUN_TIMEOUT_S = 30.0  # a run silent this long counts as hung (each step prints a line)
STARTUP_TIMEOUT_S = 180.0  # importing torch on a busy machine
PROBE_DIR_ENV, PROBE_DATA_ENV = "CAPSTONE_PROBE_DIR", "CAPSTONE_PROBE_DATA"

HINTS = {
    "10-capstone-no-ddp": "wrap the model, model = DDP(model, device_ids=...), and train through the wrapper: "
    "its backward() averages the gradients over the ranks.",
    "10-capstone-no-sampler": "give the DataLoader sampler=DistributedSampler(dataset), and no shuffle=True.",
    "10-capstone-no-set-epoch": "call sampler.set_epoch(epoch) at the start of each epoch.",
    "10-capstone-every-rank-saves": "only rank 0 writes: `if rank == 0:` around torch.save, and a barrier after it.",
    "10-capstone-not-atomic": "torch.save to a temporary file next to ckpt.pt, then os.replace(tmp, path).",
    "10-capstone-no-checkpoint": "with --stop-at-step K, save <out>/ckpt.pt after step K, then stop.",
    "10-capstone-module-keys": "save the raw model's state_dict (model.module's), not the DDP wrapper's.",
    "10-capstone-every-rank-logs": "print the log line on rank 0 only.",
    "10-capstone-local-loss": "all_reduce a tensor holding the loss sum and the sample count, then divide.",
    "10-capstone-no-unscale": "call scaler.unscale_(optimizer) before clip_grad_norm_.",
    "10-capstone-overflow-stepped": "step through the scaler: scaler.scale(loss).backward(), scaler.step(optimizer), "
    "scaler.update().",
    "10-capstone-resume-restarts-epoch": "save how many batches of the epoch were done at the stop (i + 1), and in "
    "the resumed epoch `continue` while i is below that count.",
    "10-capstone-resume-skips-every-epoch": "skip the done batches in the resumed epoch only: "
    "`if epoch == start_epoch and i < skip: continue`; every later epoch starts at its first batch.",
    "10-capstone-resume-restarts-run": "save the epoch in the checkpoint and start the loop at it: "
    "`for epoch in range(start_epoch, args.epochs)`.",
    "10-capstone-resume-not-loaded": "with --resume, load <out>/ckpt.pt on every rank (rank 0 says whether it "
    "exists; torch.load with map_location=device) and go on from its epoch, batch and step.",
    "10-capstone-rng-reseeded": "restore the random state after the last torch.manual_seed: seed, build the model, "
    "reseed with seed + rank, and only then load the checkpoint and torch.set_rng_state(...).",
    "10-capstone-rng-saved-at-start": "take the random state when you save, at the stop: "
    "torch.get_rng_state() inside the checkpoint function, not once at the start of the run.",
    "10-capstone-rank0-rng": 'restore this rank\'s own entry, ckpt["rng"][rank]: each rank drew its own masks, '
    "so each saved its own state.",
    "10-capstone-rng-some-ranks": "restore the random state on every rank, outside any `if rank == 0:`: every "
    "rank loads the checkpoint and sets its own state.",
    "10-capstone-no-autocast": "wrap the forward and the loss in torch.autocast(device.type, dtype=...): "
    "autocast for another device type than the tensors' does nothing.",
    "10-capstone-autocast-dtype": 'map the flag to its dtype: {"bf16": torch.bfloat16, "fp16": torch.float16}'
    ".get(args.amp), and autocast only when it is not None.",
    "10-capstone-rng-not-restored": "save every rank's random state (torch.get_rng_state(), and on GPUs "
    "torch.cuda.get_rng_state(device) too) with all_gather_object, and have each rank restore its own "
    "(torch.set_rng_state, torch.cuda.set_rng_state(state, device)).",
    "10-capstone-cuda-rng-not-restored": "on GPUs dropout draws from the GPU's generator: put "
    "torch.cuda.get_rng_state(device) in each rank's saved state, beside the CPU's, and restore it with "
    "torch.cuda.set_rng_state(state, device).",
    "10-capstone-sampler-seed": "give the sampler the run's seed: DistributedSampler(dataset, seed=args.seed).",
    "10-capstone-same-masks": "build the model right after torch.manual_seed(args.seed), then call "
    "torch.manual_seed(args.seed + rank): the same weights everywhere, each rank its own masks.",
    "10-capstone-no-barrier": "after rank 0's save, dist.barrier() on every rank (every rank calls it, rank 0 "
    "after writing).",
    "10-capstone-no-teardown": "end main() with dist.destroy_process_group() in a finally: block, on every rank.",
    "10-capstone-no-loader-generator": "give the DataLoader generator=torch.Generator().manual_seed(...): "
    "iter(loader) then draws from it, not from the global generator.",
    "10-capstone-loader-state-after-iter": "take the loader generator's state at the top of each epoch, "
    "loader_state = gen.get_state() before `for i, (x, y) in enumerate(loader)`, and save that one at the stop: "
    "the resumed epoch's iter(loader) then draws again what the stopped epoch drew.",
    "10-capstone-loader-generator-not-restored": "put the loader generator's state in each rank's random state "
    "(loader_state = gen.get_state(), taken before each epoch's iter(loader)), and restore it on resume: "
    'gen.set_state(mine["loader"]).',
    "10-capstone-scaler-not-restored": "save scaler.state_dict() and load it back when resuming.",
    "10-capstone-optimizer-not-restored": "save optimizer.state_dict() (the momentum) and load it back.",
}


# ------------------------------------------------------------------ the data and the flags
def make_data(world: int) -> dict[str, Any]:
    """The data file's content for `world` ranks: one-hot-ish float32 rows, one of them poisoned."""
    import torch

    from ddp_helpers.chapters.ch01_first_program.ch01_exercises import sampler_order

    n = SHARD * world - 1
    i = torch.arange(n)
    x = torch.zeros(n, FEATURES)
    x[i, i % FEATURES] = 0.5 * (1 + i // FEATURES).float()
    poisoned = sampler_order(n, world, world - 1, 0, SEED)[BATCH * (POISON_STEP - 1)]
    x[poisoned, poisoned % FEATURES] = POISON
    y = (i * 2 + i // FEATURES) % CLASSES
    return {"x": x, "y": y, "classes": CLASSES}


def script_args(
    data: str | os.PathLike[str], out: str | os.PathLike[str], amp: str, *extra: str
) -> list[str]:
    """The contract's flags, each given (the script's own defaults do not matter)."""
    flags = [("data", data), ("out", out), ("epochs", EPOCHS), ("batch-size", BATCH), ("lr", LR)]
    flags += [("momentum", MOMENTUM), ("clip", CLIP), ("hidden", HIDDEN), ("dropout", DROPOUT)]
    flags += [("amp", amp), ("seed", SEED)]
    return [part for name, value in flags for part in (f"--{name}", str(value))] + list(extra)


def expected_batches(world: int) -> list[list[list[int]]]:
    """[rank][step] -> the sample indices DistributedSampler deals, with set_epoch(epoch), for every step."""
    from ddp_helpers.chapters.ch01_first_program.ch01_exercises import sampler_order

    n = SHARD * world - 1
    out = []
    for rank in range(world):
        steps = []
        for epoch in range(EPOCHS):
            order = sampler_order(n, world, rank, epoch, SEED)
            steps += [order[b : b + BATCH] for b in range(0, len(order), BATCH)]
        out.append(steps)
    return out
