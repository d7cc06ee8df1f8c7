"""Notebook 07's exercises: gradient accumulation under no_sync(), and an averaging comm hook of your own.

Probe inputs make each mistake leave its own mark. The model is a bias-free float64 Linear that starts
at zero, stepped once by SGD with lr 1, so the weight is minus the gradient DDP left. In 07-accumulate
each micro-batch of each rank is a one-hot sample of its own coordinate, so the weight shows every
micro-batch's share; a comm hook that setup registers counts the all-reduces DDP ran, and a hook on the
weight counts the backward passes (one per micro-batch: a single backward of the stacked losses keeps every
micro-batch's graph alive at once, which accumulation exists to avoid). In 07-hook each
rank's sample is the one-hot of its rank, so an average, a sum and a double division all differ; the
other ranks start their forward only once rank 0's hook has returned, so the future rank 0's hook
returns is still pending unless the hook waited for its all-reduce (right, but nothing overlaps: a note).
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


def _micro_batch_shares(seen_row: dict[str, Any], world: int) -> list[list[float]]:
    """The weight, as [rank][micro-batch]."""
    weight = seen_row["weight"]
    return [weight[r * ACCUMULATE : (r + 1) * ACCUMULATE] for r in range(world)]


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
        shares = _micro_batch_shares(s, world)
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
        "One optimizer step over the micro-batches in `micro_batches`: run every micro-batch but the last "
        "(forward and backward) inside `ddp_model.no_sync()`, the last one outside it, each loss divided by "
        "the number of micro-batches, then step. The gradient must be the mean over all ranks and "
        "micro-batches, with one all-reduce per step."
    ),
    given=(
        "`ddp_model` (a DDP-wrapped Linear; a comm hook counts its all-reduces), `micro_batches` "
        f"({ACCUMULATE} tensors, this rank's), `optimizer` (SGD, lr 1)"
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
    hint=(
        "DDP decides in forward whether the next backward all-reduces: a forward inside `no_sync()` gives a "
        "backward that only adds to `.grad`. The last micro-batch's forward and backward run outside it, and "
        "its all-reduce carries the sum of all micro-batches. The losses add up over micro-batches: divide each "
        "by their number."
    ),
    setup=_accumulate_setup,
    observe=_accumulate_observe,
    expected=_accumulate_expected,
    mistakes=(
        Mistake(
            "07-accumulate-not-divided",
            f"the step is {ACCUMULATE}x too large: the micro-batches' gradients add up in .grad, so each loss "
            "must be divided by the number of micro-batches for the step to use their mean",
            _not_divided,
            hint=(
                "Divide each micro-batch's loss by the number of micro-batches (`accumulate`) before its "
                "backward(), the last one's too: the step then uses their mean."
            ),
        ),
        Mistake(
            "07-accumulate-synced-every-micro-batch",
            f"the weights are right, but DDP all-reduced {ACCUMULATE} times in one step, once per micro-batch: "
            "without no_sync() every backward all-reduces, and accumulation saves no communication",
            _synced_every_micro_batch,
            hint=(
                "Put the forward and the backward of every micro-batch but the last inside "
                "`with ddp_model.no_sync():`, the forward included: DDP decides in forward whether the next "
                "backward all-reduces."
            ),
        ),
        Mistake(
            "07-accumulate-one-backward",
            f"the weights are right, with one all-reduce, but from one backward(): every micro-batch's forward "
            f"ran first and their losses were summed (or stacked), so all {ACCUMULATE} graphs, activations "
            "included, were alive at once. Accumulation exists to fit a batch that memory cannot hold: call "
            "backward() on each micro-batch's loss as it comes, and its graph is freed",
            _one_backward,
            hint=(
                "Call backward() on each micro-batch's loss (divided by their number) right after its forward, "
                "in the same loop iteration, and keep no list of losses: each backward frees its graph before "
                "the next forward builds one."
            ),
        ),
        Mistake(
            "07-accumulate-never-synced",
            "DDP never all-reduced: every micro-batch ran under no_sync(), the last one too, so each rank "
            "stepped with its own gradients and the replicas now differ",
            _never_synced,
            hint=(
                "Take the last micro-batch out of no_sync(): its forward and backward run after the with "
                "block, and that backward all-reduces the sum of every micro-batch's gradient."
            ),
        ),
        Mistake(
            "07-accumulate-only-last",
            "only the last micro-batch moved the weights: the gradients accumulated before it were zeroed "
            "(a zero_grad() inside the loop?), so the step saw 1/K of the data",
            _only_last_micro_batch,
            hint=(
                "Clear the gradients only after optimizer.step(): between micro-batches they must add up in "
                ".grad."
            ),
        ),
    ),
    covers=("no-sync-accumulation",),
)

# ------------------------------------------------------------------ 07-hook
WIDTH = 8  # one-hot inputs: one coordinate per rank, up to 8 ranks
GATE_S = 2.0  # the longest the other ranks wait for rank 0's hook to return (a blocking hook: this long)
WAITED = (
    "your hook returned a future that was already complete: it waited for its all-reduce (a blocking "
    "dist.all_reduce, or a wait()). The mean is right, but each bucket's hook then holds up the rest of "
    "backward until the bucket is reduced, so no communication overlaps computation. Return the future of "
    "dist.all_reduce(..., async_op=True), chained with .then(...): DDP waits for it at the end of backward"
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
    # Did the hook wait for its all-reduce? On rank 0, was the future it returned already complete? The
    # other ranks start their forward only once rank 0's hook has returned (a file says so; or after
    # GATE_S), so that an asynchronous all-reduce cannot have completed by then, and a blocking one has
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
        "Write `hook(state, bucket)`, a DDP communication hook that does what DDP does by default: all-reduce "
        "the bucket's flat gradients (`bucket.buffer()`) so that every rank holds their **mean**, "
        "asynchronously, and return a future whose value is that one tensor. Register it on `ddp_model`, "
        "then take the step."
    ),
    given="`ddp_model` (a DDP-wrapped Linear), `x` (this rank's sample), `optimizer` (SGD, lr 1), `dist`",
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
    hint=(
        "An all-reduce sums; dividing the buffer by the world size once, before or after, makes the sum the "
        "mean. `dist.all_reduce(..., async_op=True).get_future()` gives a future whose value is a list of the "
        "tensors reduced: `.then(lambda fut: fut.value()[0])` turns it into the future of one tensor that DDP "
        "copies back into the gradients."
    ),
    setup=_hook_setup,
    observe=_hook_observe,
    expected=_hook_expected,
    mistakes=(
        Mistake(
            "07-hook-summed",
            "every rank stepped with the SUM of the ranks' gradients, world-size times the mean: an all-reduce "
            "sums, and the hook must divide by the world size",
            _hook_factor(lambda world: world),
            hint=(
                "Divide by dist.get_world_size() once: the bucket's buffer before the all-reduce "
                "(buffer.div_(...)), or the reduced tensor in the .then() after it."
            ),
        ),
        Mistake(
            "07-hook-divided-twice",
            "every rank stepped with 1/world-size of the mean: the hook divided by the world size twice (before "
            "and after the all-reduce?)",
            _hook_factor(lambda world: 1.0 / world),
            hint=(
                "Divide in one place only: either the buffer before the all-reduce, or the reduced tensor in "
                ".then(), not both."
            ),
        ),
        Mistake(
            "07-hook-future-of-a-list",
            "DDP refused the hook's result: the future of an all-reduce holds a list of tensors, and DDP wants a "
            "future of the one tensor. Return future.then(lambda fut: fut.value()[0])",
            _future_of_a_list,
            hint=(
                "Chain .then(lambda fut: fut.value()[0]) onto the all-reduce's future and return the future "
                "that .then() makes: its value is the one reduced tensor, which DDP copies into the gradients."
            ),
        ),
        Mistake(
            "07-hook-bucket-renamed",
            "DDP refused the hook when it was registered (KeyError: 'bucket'): register_comm_hook reads the "
            "hook's parameters by name, and this hook has none called `bucket`, so it never ran",
            lambda seen, expected: all("KeyError: 'bucket'" in str(s.get("error") or "") for s in seen),
            hint=(
                "Name the hook's parameters `state` and `bucket`, as DDP calls them: `def hook(state, bucket):`."
            ),
        ),
    ),
    covers=(),
)

EXERCISES = (ACCUMULATE_EXERCISE, HOOK)
