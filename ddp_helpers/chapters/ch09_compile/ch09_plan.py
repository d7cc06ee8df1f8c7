"""Notebook 09: torch.compile with DDP on live ranks (at least two), and its exercises' live ranks."""

from __future__ import annotations

import time
from pathlib import Path

from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, by_kind, placement, placement_line

PER_RANK_BATCH = 16  # compile_ddp.batch()'s default: each rank's batch in every experiment
# width 512: 1 MiB of gradient per layer, so a 1 MiB bucket cap gives DDPOptimizer one piece per layer.
# steps: eager and compiled, each, in the cost run; bucket_caps: the companion's sweep (deeper/09)
MODEL = {"width": 512, "depth": 4}
SIZES = {kind: {**MODEL, "steps": 20, "bucket_caps": "1,2,25"} for kind in ("cpu", "cuda")}
SMOKE_SIZES = {kind: {**MODEL, "steps": 6, "bucket_caps": "1,25"} for kind in ("cpu", "cuda")}


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    world = max(machine.nproc, 2)  # one rank has nothing to overlap and no other rank to differ from
    live = placement(machine, world, batch=PER_RANK_BATCH * world)
    line = placement_line(machine, live)
    if world != machine.nproc:
        line = f"nproc = {machine.nproc}, but these demos compare ranks: they run {world}. {line}"
    return NotebookPlan(
        notebook="09",
        machine=machine,
        device=live.device,
        line=line,
        runs={"live": live, "exercises": placement(machine, world)},
        sizes=by_kind(live.device, SMOKE_SIZES if smoke else SIZES),
    )


def fresh_cache_env(root: str | Path) -> dict[str, str]:
    """The launch env that gives a run an empty inductor cache folder under `root`, new at each call."""
    # a first compile measured cold: inductor's cache lives on disk and torch._dynamo.reset() does not clear it
    folder = (Path(root) / f"inductor-cache-{time.time_ns()}").resolve()
    folder.mkdir(parents=True)
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder)}
