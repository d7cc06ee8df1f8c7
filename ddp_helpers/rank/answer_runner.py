"""Rank side: run one answer in a fresh namespace, with the probe inputs and observers, and report.
An answer's exception is raised again once the result is kept in `LAST`, so that the others, waiting in
a collective, end in seconds rather than at the timeout."""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from ddp_helpers.rank.observers import Observers
from ddp_helpers.rank.registry import get
from ddp_helpers.rank.spec import Context, environment

ANSWER_FILE = "<your answer>"
LAST: dict[str, Any] | None = None  # the last run's result on this rank, None while one runs


def context(workdir: str) -> Context:
    """This rank's identity, from the process group (a one-rank run without one is rank 0 of 1)."""
    joined = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if joined else 0
    world = dist.get_world_size() if joined else 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = dist.get_backend() if joined else "gloo"
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    return Context(rank, world, local_rank, device, str(backend), workdir)


def node_layout(rank: int, world: int, nodes: int) -> dict[str, int] | None:
    """Where `rank` sits on a job of `nodes` nodes: the variables torchrun sets per node, as numbers."""
    per_node = -(-world // max(nodes, 1))
    if world < 2 or per_node >= world:
        return None
    node = rank // per_node
    return {
        "LOCAL_RANK": rank - node * per_node,
        "LOCAL_WORLD_SIZE": min(per_node, world - node * per_node),
        "GROUP_RANK": node,  # the node's (the agent's) number
        "GROUP_WORLD_SIZE": -(-world // per_node),  # the nodes
        "ROLE_RANK": rank,  # one role ("default"): the role's ranks are the job's
        "ROLE_WORLD_SIZE": world,
    }


def run(exercise_id: str, code: str, workdir: str) -> dict[str, Any]:
    """Run `code` as exercise `exercise_id` on this rank; what it did, as plain values (also in `LAST`)."""
    global LAST
    LAST = None
    exercise = get(exercise_id)
    ctx = context(workdir)
    os.makedirs(workdir, exist_ok=True)
    # what every answer starts with, as the live ranks' own namespace does, then the exercise's own names
    namespace: dict[str, Any] = dict(torch=torch, dist=dist, nn=nn, F=F, DDP=DDP, DataLoader=DataLoader)
    namespace.update(DistributedSampler=DistributedSampler, os=os, rank=ctx.rank, local_rank=ctx.local_rank)
    namespace.update(__name__="__exercise__", world_size=ctx.world_size, device=ctx.device)
    namespace.update(exercise.setup(ctx))
    # pretend nodes (Exercise.nodes) on the CPU only: on GPUs an answer takes its own GPU from `local_rank`
    on_cpu = getattr(namespace.get("device"), "type", None) == "cpu"
    layout = node_layout(ctx.rank, ctx.world_size, exercise.nodes) if exercise.nodes > 1 and on_cpu else None
    if layout is not None and isinstance(namespace.get("local_rank"), int):  # 06 gives None: it reads `env`
        namespace["local_rank"] = layout["LOCAL_RANK"]
    # the layout the answer ran in (None: the machine's own), for the signatures of LOCAL_RANK mistakes
    result: dict[str, Any] = {"rank": ctx.rank, "error": None, "node layout": layout}
    raised: Exception | None = None
    with Observers() as seen, environment(layout or {}):  # dist.get_node_local_rank() reads LOCAL_RANK too
        try:
            exec(compile(code, ANSWER_FILE, "exec"), namespace)
        except Exception as error:  # the learner's exception is a finding: kept, then raised again
            result["error"], raised = _answer_error(error), error
    result["collectives"] = seen.collectives
    result["saved"] = len(seen.saves)
    namespace["_collectives"] = list(seen.collectives)  # for an observe that judges them by their effect
    namespace["_loads_mapped"] = list(seen.loads)
    try:  # also after an exception: what the answer did before it raised can name the mistake
        result.update(exercise.observe(namespace, ctx))
    except Exception as error:  # e.g. a name the task asked for was never bound
        if result["error"] is None:
            result["error"] = f"{type(error).__name__}: {error}"
    LAST = result
    if raised is not None:
        raise raised
    return result


def _answer_error(error: BaseException) -> str:
    """The exception, with the lines of the answer it passed through (not the checker's frames)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == ANSWER_FILE]
    where = f" (line {frames[-1].lineno} of your answer)" if frames else ""
    return f"{type(error).__name__}: {error}{where}"
