"""Notebook 01: 01-wrap (see the package's docstring)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddp_helpers.chapters.ch01_first_program.ch01_shared import _first_of_each_node, _module_keys, _not_saved
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen

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


def _wrap_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import os

    import torch

    wrapped: Any = ns.get("ddp_model")
    plain: Any = getattr(wrapped, "module", wrapped)
    out: dict[str, Any] = {
        "is_ddp": isinstance(wrapped, torch.nn.parallel.DistributedDataParallel),
        "weight": [round(v, 12) for v in plain.weight.detach().cpu().flatten().tolist()],
    }  # "saved", the count of torch.save calls, comes from the observers
    if ctx.rank == 0:
        path = ns["save_path"]
        out["file_keys"] = sorted(torch.load(path, map_location="cpu")) if os.path.exists(path) else None
    return out


def _one_hot_steps(
    world: int, width: int, start: float, moved: float, ranks: range | None = None
) -> list[float]:
    return [
        start + (moved if i in (ranks if ranks is not None else range(world)) else 0.0) for i in range(width)
    ]


def _wrap_expected(world: int) -> Seen:
    width = max(WIDTH, world)
    weight = _one_hot_steps(world, width, 0.0, -WRAP_STEPS / world)  # rank 0's start, the averages taken
    rows: Seen = [{"is_ddp": True, "weight": weight, "saved": 1 if r == 0 else 0} for r in range(world)]
    rows[0]["file_keys"] = ["weight"]
    return rows


def _own_steps(start_of_rank: Any) -> Any:
    """Each rank moved by its own gradient only, from `start_of_rank(r)`."""

    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        return world > 1 and all(
            s["weight"]
            == _one_hot_steps(world, len(s["weight"]), start_of_rank(r), -WRAP_STEPS, range(r, r + 1))
            for r, s in enumerate(seen)
        )

    return matches


def _every_coordinate_moved(by: Callable[[int], float]) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        return world > 1 and all(
            s["weight"] == _one_hot_steps(world, len(s["weight"]), 0.0, by(world)) for s in seen
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
    observe=_wrap_observe,
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
            lambda seen, expected: len(seen) > 1 and all(s.get("saved") for s in seen),
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
