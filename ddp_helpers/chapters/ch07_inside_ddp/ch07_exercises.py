"""Notebook 07's exercises: gradient accumulation under no_sync(), and an averaging comm hook of your own.

A bias-free float64 Linear starting at zero, stepped once by SGD with lr 1, so the weight is minus the
gradient DDP left; one-hot inputs per (rank, micro-batch) make each mistake leave its own mark.
"""

from __future__ import annotations

import math
from typing import Any

from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, close, scaled

# ------------------------------------------------------------------ 07-accumulate
ACCUMULATE = 3  # micro-batches per optimizer step


def _accumulate_setup(ctx: Context) -> dict[str, Any]:
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    width = ctx.world_size * ACCUMULATE  # one coordinate per (rank, micro-batch)
    model = torch.nn.Linear(width, 1, bias=False, dtype=torch.float64).to(ctx.device)
    torch.nn.init.zeros_(model.weight)
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    calls: list[int] = []

    def counted(state, bucket):  # DDP's averaging all-reduce, counted
        # (no annotations: DDP refuses a `bucket` annotated other than dist.GradBucket)
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(None, counted)
    backwards: list[int] = []
    model.weight.register_hook(lambda grad: backwards.append(1))  # once per backward pass through the model
    micro_batches = []
    for k in range(ACCUMULATE):
        x = torch.zeros(1, width, dtype=torch.float64, device=ctx.device)
        x[0, ctx.rank * ACCUMULATE + k] = 1.0  # rank r's micro-batch k: its gradient is this one-hot
        micro_batches.append(x)
    return {
        "ddp_model": ddp_model,
        "micro_batches": micro_batches,
        "optimizer": torch.optim.SGD(ddp_model.parameters(), lr=1.0),
        "_probe": {"model": model, "allreduces": calls, "backwards": backwards},
    }


def _accumulate_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    probe = ns["_probe"]
    weight = probe["model"].weight.detach().cpu().flatten().tolist()
    return {
        "weight": [round(v, 12) for v in weight],
        "allreduces": len(probe["allreduces"]),
        "backwards": len(probe["backwards"]),
    }


def _accumulate_expected(world: int) -> Seen:
    # every rank: minus the mean over ranks of the mean over micro-batches of the one-hot gradients
    weight = [-1.0 / (ACCUMULATE * world)] * (world * ACCUMULATE)
    return [{"weight": weight, "allreduces": 1, "backwards": ACCUMULATE} for _ in range(world)]


def _scaled_by(seen_row: dict[str, Any], expected_row: dict[str, Any], factor: float) -> bool:
    k = scaled(seen_row["weight"], expected_row["weight"]) if seen_row.get("weight") else None
    return k is not None and math.isclose(k, factor, rel_tol=1e-6)


def _not_divided(seen: Seen, expected: Seen) -> bool:
    return all(_scaled_by(s, e, ACCUMULATE) for s, e in zip(seen, expected, strict=True))


def _synced_every_micro_batch(seen: Seen, expected: Seen) -> bool:
    return all(
        close(s.get("weight"), e["weight"]) and s.get("allreduces") == ACCUMULATE
        for s, e in zip(seen, expected, strict=True)
    )


def _one_backward(seen: Seen, expected: Seen) -> bool:
    return all(
        close(s.get("weight"), e["weight"]) and s.get("allreduces") == 1 and s.get("backwards") == 1
        for s, e in zip(seen, expected, strict=True)
    )


def _never_synced(seen: Seen, expected: Seen) -> bool:
    return all(s.get("allreduces") == 0 for s in seen) and any(any(s.get("weight") or []) for s in seen)


def _only_last_micro_batch(seen: Seen, expected: Seen) -> bool:
    world = len(seen)
    for s in seen:
        if not s.get("weight"):
            return False
        shares = [s["weight"][r * ACCUMULATE : (r + 1) * ACCUMULATE] for r in range(world)]  # per rank
        if any(share[:-1] != [0.0] * (ACCUMULATE - 1) for share in shares):
            return False
        if not any(share[-1] for share in shares):
            return False
    return True


ACCUMULATE_EXERCISE = Exercise(
    id="07-accumulate",
    notebook="07",
    title="Accumulate gradients under no_sync(), all-reduce once",
    task=(
        "One optimizer step over `micro_batches`: every micro-batch but the last inside "
        "`ddp_model.no_sync()`, each loss divided by their number, then step."
    ),
    starter=(
        "accumulate = len(micro_batches)\n"
        "for x in micro_batches[:-1]:\n"
        "    ...  # TODO: forward and backward of x, without an all-reduce\n"
        "...  # TODO: forward and backward of the last micro-batch: this one all-reduces\n"
        "optimizer.step()\n"
        "optimizer.zero_grad()\n"
    ),
    reference=(
        "accumulate = len(micro_batches)  # K micro-batches, one optimizer step\n"
        "for x in micro_batches[:-1]:\n"
        "    with ddp_model.no_sync():  # forward and backward accumulate locally: no all-reduce\n"
        "        loss = ddp_model(x).sum() / accumulate  # each micro-batch weighs 1/K\n"
        "        loss.backward()\n"
        "loss = ddp_model(micro_batches[-1]).sum() / accumulate  # the last, outside no_sync()\n"
        "loss.backward()  # all-reduces the accumulated sum, once\n"
        "optimizer.step()\n"
        "optimizer.zero_grad()\n"
    ),
    hint="A forward inside `no_sync()` makes its backward only add to `.grad`; the last one all-reduces the sum.",
    setup=_accumulate_setup,
    observe=_accumulate_observe,
    expected=_accumulate_expected,
    mistakes=(
        Mistake(
            "07-accumulate-not-divided",
            f"the step is {ACCUMULATE}x too large: the micro-batches' gradients add up in .grad.",
            _not_divided,
            hint="Divide each micro-batch's loss by `accumulate` before its backward().",
        ),
        Mistake(
            "07-accumulate-synced-every-micro-batch",
            f"the weights are right, but DDP all-reduced {ACCUMULATE} times in one step, once per micro-batch.",
            _synced_every_micro_batch,
            hint="Run the forward and backward of every micro-batch but the last inside `ddp_model.no_sync()`.",
        ),
        Mistake(
            "07-accumulate-one-backward",
            f"the weights are right, but from one backward() of the summed losses: all {ACCUMULATE} graphs were "
            "alive at once, the memory accumulation exists to save.",
            _one_backward,
            hint="Call backward() on each micro-batch's loss right after its forward.",
        ),
        Mistake(
            "07-accumulate-never-synced",
            "DDP never all-reduced: the last micro-batch ran under no_sync() too, and the replicas now differ.",
            _never_synced,
            hint="Run the last micro-batch's forward and backward after the no_sync() block.",
        ),
        Mistake(
            "07-accumulate-only-last",
            "only the last micro-batch moved the weights: the gradients before it were zeroed in the loop.",
            _only_last_micro_batch,
            hint="Call zero_grad() only after optimizer.step().",
        ),
    ),
    covers=("no-sync-accumulation",),
)

# ------------------------------------------------------------------ 07-hook
WIDTH = 8  # one-hot inputs: one coordinate per rank, up to 8 ranks
GATE_S = 2.0  # the longest the other ranks wait for rank 0's hook to return (a blocking hook: this long)
WAITED = (
    "it waited for its all-reduce, so no communication overlaps backward. Return the future of "
    "dist.all_reduce(..., async_op=True) chained with .then(...)"
)


def _hook_setup(ctx: Context) -> dict[str, Any]:
    import functools
    import os
    import time

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = torch.nn.Linear(max(WIDTH, ctx.world_size), 1, bias=False, dtype=torch.float64).to(ctx.device)
    torch.nn.init.zeros_(model.weight)
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    x = torch.zeros(1, model.in_features, dtype=torch.float64, device=ctx.device)
    x[0, ctx.rank] = 1.0  # this rank's sample: its gradient is the one-hot of its rank
    # did rank 0's hook return a completed future? The others start their forward only after it returned,
    # so an asynchronous all-reduce cannot have completed by then, and a blocking one has
    gate = os.path.join(ctx.workdir, "07-hook-rank0-returned")
    done_on_return: list[bool | None] = []
    register = ddp_model.register_comm_hook

    def watched_register(state: Any, hook: Any) -> Any:
        if not callable(hook):
            return register(state, hook)  # DDP's own refusal

        @functools.wraps(hook)  # DDP checks the learner's signature, through __wrapped__
        def watched(state, bucket):
            future = hook(state, bucket)
            if ctx.rank == 0:
                done = getattr(future, "done", None)
                done_on_return.append(bool(done()) if callable(done) else None)
                with open(gate, "w"):
                    pass
            return future

        return register(state, watched)

    def after_rank0s_hook(module: Any, args: Any) -> None:
        deadline = time.monotonic() + GATE_S
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.005)

    ddp_model.register_comm_hook = watched_register  # type: ignore[method-assign]
    if ctx.rank > 0:
        model.register_forward_pre_hook(after_rank0s_hook)
    return {
        "ddp_model": ddp_model,
        "x": x,
        "optimizer": torch.optim.SGD(ddp_model.parameters(), lr=1.0),
        "_probe": model,
        "_done_on_return": done_on_return,
    }


def _hook_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    weight = ns["_probe"].weight.detach().cpu().flatten().tolist()
    done = ns["_done_on_return"]
    waited = ctx.world_size > 1 and bool(done) and all(done)
    return {"weight": [round(v, 12) for v in weight], "notes": [WAITED] if waited else []}


def _hook_expected(world: int) -> Seen:
    width = max(WIDTH, world)
    weight = [-1.0 / world if i < world else 0.0 for i in range(width)]  # lr 1 times the averaged one-hots
    return [{"weight": weight} for _ in range(world)]


def _hook_factor(factor: Any) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        return world > 1 and all(_scaled_by(s, e, factor(world)) for s, e in zip(seen, expected, strict=True))

    return matches


def _future_of_a_list(seen: Seen, expected: Seen) -> bool:
    # DDP takes the hook's future's value as the bucket's one tensor; an all-reduce's own future holds a list
    errors = [str(s.get("error") or "") for s in seen]
    return all(("PyObject" in e or "Unable to cast [" in e or "TensorList" in e) for e in errors)


HOOK = Exercise(
    id="07-hook",
    notebook="07",
    title="A comm hook that averages each bucket",
    task=(
        "Write `hook(state, bucket)`: all-reduce `bucket.buffer()` asynchronously to its mean and return a "
        "future of that one tensor; register it on `ddp_model`, then step."
    ),
    starter=(
        "def hook(state, bucket):\n"
        "    buffer = ...  # TODO: the bucket's gradients, ready to be averaged\n"
        "    return ...  # TODO: a future whose value is the averaged buffer\n"
        "\n"
        "\n"
        "ddp_model.register_comm_hook(None, hook)\n"
        "ddp_model(x).sum().backward()\n"
        "optimizer.step()\n"
    ),
    reference=(
        "def hook(state, bucket):  # DDP looks the parameter up by its name: bucket\n"
        "    buffer = bucket.buffer().div_(dist.get_world_size())  # divide first: the sum is then the mean\n"
        "    future = dist.all_reduce(buffer, async_op=True).get_future()  # its value: a list of one tensor\n"
        "    return future.then(lambda fut: fut.value()[0])  # DDP wants a future of the tensor itself\n"
        "\n"
        "\n"
        "ddp_model.register_comm_hook(None, hook)\n"
        "ddp_model(x).sum().backward()\n"
        "optimizer.step()\n"
    ),
    hint="Divide by the world size once; `.then(lambda fut: fut.value()[0])` gives DDP its one tensor.",
    setup=_hook_setup,
    observe=_hook_observe,
    expected=_hook_expected,
    mistakes=(
        Mistake(
            "07-hook-summed",
            "every rank stepped with the SUM of the ranks' gradients: an all-reduce sums.",
            _hook_factor(lambda world: world),
            hint="Divide by dist.get_world_size() once, before the all-reduce or in the .then().",
        ),
        Mistake(
            "07-hook-divided-twice",
            "every rank stepped with 1/world-size of the mean: the hook divided twice.",
            _hook_factor(lambda world: 1.0 / world),
            hint="Divide either the buffer before the all-reduce or the result in .then(), not both.",
        ),
        Mistake(
            "07-hook-future-of-a-list",
            "DDP refused the hook's result: an all-reduce's future holds a list of tensors.",
            _future_of_a_list,
            hint="Return future.then(lambda fut: fut.value()[0]).",
        ),
        Mistake(
            "07-hook-bucket-renamed",
            "DDP refused the hook (KeyError: 'bucket'): it reads the hook's parameters by name.",
            lambda seen, expected: all("KeyError: 'bucket'" in str(s.get("error") or "") for s in seen),
            hint="Write `def hook(state, bucket):`.",
        ),
    ),
    covers=(),
)

EXERCISES = (ACCUMULATE_EXERCISE, HOOK)
