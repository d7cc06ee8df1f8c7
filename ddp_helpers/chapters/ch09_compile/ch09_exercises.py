"""Notebook 09's exercises: save a compiled DDP model with plain keys; a short last batch that compiles once.

Dynamo runs with the "eager" backend or a counting one; each setup calls `torch._dynamo.reset()` so that
no check learns from the previous one.
"""

from __future__ import annotations

import functools
from typing import Any

from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, close

# ------------------------------------------------------------------ 09-save
WIDTH = 8  # one-hot inputs: one coordinate per rank, up to 8 ranks


def _save_setup(ctx: Context) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()
    model = torch.nn.Linear(max(WIDTH, ctx.world_size), 1, bias=False, dtype=torch.float64).to(ctx.device)
    torch.nn.init.zeros_(model.weight)
    compiled = torch.compile(model, backend="eager")  # an OptimizedModule: it holds `model` as _orig_mod
    ddp_model = DDP(compiled, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    x = torch.zeros(1, model.in_features, dtype=torch.float64, device=ctx.device)
    x[0, ctx.rank] = 1.0  # this rank's sample: its gradient is the one-hot of its rank
    return {
        "ddp_model": ddp_model,
        "optimizer": torch.optim.SGD(ddp_model.parameters(), lr=1.0),
        "x": x,
        "save_path": f"{ctx.workdir}/compiled-model.pt",
    }


def _save_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import os

    import torch

    out: dict[str, Any] = {}  # "saved", the count of torch.save calls, comes from the observers
    if ctx.rank == 0:
        path = ns["save_path"]
        keys: Any = None
        weight = None
        if os.path.exists(path):
            try:
                state = torch.load(path, map_location="cpu")
            except Exception as error:  # torch.load (weights_only) refuses what is not tensors
                keys = f"a file torch.load refused ({type(error).__name__}), not a state_dict"
            else:
                if isinstance(state, dict):
                    keys = sorted(str(k) for k in state)
                    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
                    if len(tensors) == 1:
                        weight = [round(v, 12) for v in tensors[0].flatten().tolist()]
                else:
                    keys = f"not a state_dict: a {type(state).__name__}"
        out["file_keys"], out["file_weight"] = keys, weight
    return out


def _save_expected(world: int) -> Seen:
    width = max(WIDTH, world)
    weight = [-1.0 / world if i < world else 0.0 for i in range(width)]  # one averaged SGD step, lr 1
    rows: Seen = [{"saved": 1 if r == 0 else 0} for r in range(world)]
    rows[0].update({"file_keys": ["weight"], "file_weight": weight})
    return rows


def _keys_start(prefix: str) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        keys = seen[0].get("file_keys")
        return isinstance(keys, list) and bool(keys) and all(k.startswith(prefix) for k in keys)

    return matches


SAVE = Exercise(
    id="09-save",
    notebook="09",
    title="Save a compiled DDP model with the plain model's keys",
    task="After the step, let rank 0 save to `save_path` a `state_dict` with the plain model's keys.",
    starter=(
        "ddp_model(x).sum().backward()\n"
        "optimizer.step()\n"
        "if rank == 0:\n"
        "    state = ...  # TODO: the state_dict with the plain model's keys\n"
        "    torch.save(state, save_path)\n"
    ),
    reference=(
        "ddp_model(x).sum().backward()\n"
        "optimizer.step()\n"
        "if rank == 0:  # one writer\n"
        "    state = ddp_model.module._orig_mod.state_dict()  # DDP's .module, then compile's _orig_mod\n"
        "    torch.save(state, save_path)\n"
    ),
    hint="DDP keeps the model as `.module`, `torch.compile`'s wrapper as `._orig_mod`: unwrap both.",
    setup=_save_setup,
    observe=_save_observe,
    expected=_save_expected,
    mistakes=(
        Mistake(
            "09-save-module-keys",
            "the saved keys start with 'module.': the DDP wrapper's state_dict, which a plain model refuses.",
            _keys_start("module."),
            hint="Save ddp_model.module._orig_mod.state_dict().",
        ),
        Mistake(
            "09-save-orig-mod-keys",
            "the saved keys start with '_orig_mod.': the compiled module's state_dict.",
            _keys_start("_orig_mod."),
            hint="Unwrap the compiled module too: ddp_model.module._orig_mod.state_dict().",
        ),
        Mistake(
            "09-save-not-saved",
            "rank 0 wrote no file at save_path",
            lambda seen, expected: seen[0].get("file_keys") is None and not seen[0].get("error"),
            hint="Let rank 0 call torch.save(state, save_path).",
        ),
        Mistake(
            "09-save-every-rank",
            "every rank called torch.save (see saved): N writers race to one path.",
            lambda seen, expected: len(seen) > 1 and all((s.get("saved") or 0) >= 1 for s in seen),
            hint="Put the torch.save alone under `if rank == 0:`.",
        ),
    ),
    covers=("save-module",),
)

# ------------------------------------------------------------------ 09-last-batch
PER_RANK = 7  # samples in each rank's shard
BATCH = 4  # a full batch, then a short one of 3


def _last_batch_setup(ctx: Context) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import TensorDataset

    torch._dynamo.reset()  # forget the batch sizes earlier checks showed Dynamo
    graphs: list[int] = []

    def counting_backend(gm: Any, example_inputs: list[Any]) -> Any:  # a compile, counted; runs eagerly
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    net = torch.nn.Linear(4, 1, dtype=torch.float64).to(ctx.device)
    ddp_model = DDP(
        torch.compile(net, backend=counting_backend),
        device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None,
    )
    marks, inputs = _watch_marks(ddp_model)
    dataset = TensorDataset(_last_batch_rows(ctx.world_size))  # the same dataset on every rank
    # cpu:0, not cpu: x.to(device) then makes a new tensor as a move to a GPU does, so a mark made before
    # the move is lost here as there
    device = torch.device("cpu", 0) if ctx.device.type == "cpu" else ctx.device
    return {
        "ddp_model": ddp_model,
        "dataset": dataset,
        "batch_size": BATCH,
        "device": device,
        "_compiles": graphs,
        "_net": net,
        "_marks": marks,
        "_inputs": inputs,
    }


def _watch_marks(ddp_model: Any) -> tuple[list[Any], list[bool]]:
    """The tensors marked dynamic, and per forward whether ddp_model got one of them (observe unpatches)."""
    import weakref

    import torch

    real = getattr(torch._dynamo.mark_dynamic, "__wrapped__", torch._dynamo.mark_dynamic)
    marks: list[Any] = []
    inputs: list[bool] = []

    @functools.wraps(real)
    def mark_dynamic(t: Any, *args: Any, **kwargs: Any) -> Any:
        marks.append(weakref.ref(t))
        return real(t, *args, **kwargs)

    def saw(module: Any, args: tuple[Any, ...]) -> None:
        given = args[0] if args else None
        inputs.append(any(mark() is given for mark in marks))

    torch._dynamo.mark_dynamic = mark_dynamic
    ddp_model.register_forward_pre_hook(saw)
    return marks, inputs


def _last_batch_rows(world: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(0)
    return torch.randn(PER_RANK * world, 4, dtype=torch.float64, generator=generator)


def _last_batch_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import torch

    torch._dynamo.mark_dynamic = getattr(
        torch._dynamo.mark_dynamic, "__wrapped__", torch._dynamo.mark_dynamic
    )
    marked = {"marks": len(ns["_marks"]), "inputs marked": list(ns["_inputs"])}
    samples = ns.get("samples")
    try:
        samples = int(samples) if samples is not None else None
    except (TypeError, ValueError):
        samples = None
    net = ns["_net"]
    grads = {
        name: None if p.grad is None else [round(v, 12) for v in p.grad.detach().cpu().flatten().tolist()]
        for name, p in (("grad_weight", net.weight), ("grad_bias", net.bias))
    }  # every parameter's: a padding row adds nothing to the weight's, but the bias's takes it as a sample
    return {"compiles": len(ns["_compiles"]), "samples": samples, **grads, **marked}


def _last_batch_expected(world: int) -> Seen:
    # DDP averages over the ranks, .grad adds the batches: the weight's gradient is the world's sample sum
    # over world, the bias's PER_RANK
    rows = _last_batch_rows(world)
    weight = [round(v, 12) for v in (rows.sum(dim=0) / world).tolist()]
    return [
        {"compiles": 1, "samples": PER_RANK * world, "grad_weight": weight, "grad_bias": [float(PER_RANK)]}
        for _ in range(world)
    ]


def _padding_in_loss(seen: Seen, expected: Seen) -> bool:
    return all(
        s.get("compiles") == 1
        and s.get("samples") == e["samples"]
        and close(s.get("grad_weight"), e["grad_weight"])
        and close(s.get("grad_bias"), [float(2 * BATCH)])
        for s, e in zip(seen, expected, strict=True)
    )


def _marked_before_move(seen: Seen, expected: Seen) -> bool:
    return all(
        s.get("compiles") == 2 and s.get("marks") and not any(s.get("inputs marked") or [True]) for s in seen
    )


def _samples_in(counts: Any) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        world = len(seen)
        return all(s.get("samples") in counts(world) and s.get("compiles") == 1 for s in seen)

    return matches


LAST_BATCH = Exercise(
    id="09-last-batch",
    notebook="09",
    title="Compile once for a short last batch, and count every sample",
    task=(
        "Loop once over a loader of this rank's shard so that Dynamo compiles **once**, every sample is "
        "trained on, and `samples` is the number of real samples all ranks trained on."
    ),
    starter=(
        "sampler = DistributedSampler(dataset, shuffle=False)\n"
        "loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=...)  # TODO\n"
        "seen = torch.zeros((), dtype=torch.int64, device=device)  # on the device: NCCL reduces no CPU tensor\n"
        "for (x,) in loader:\n"
        "    x = x.to(device)  # the tensor the model gets: DDP would copy a CPU batch to the GPU, unmarked\n"
        "    ...  # TODO: so that the short last batch does not compile again\n"
        "    ddp_model(x).sum().backward()\n"
        "    seen += len(x)\n"
        "...  # TODO: every rank's count, added up\n"
        "samples = int(seen)\n"
    ),
    reference=(
        "sampler = DistributedSampler(dataset, shuffle=False)\n"
        "loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=False)  # keep it\n"
        "seen = torch.zeros((), dtype=torch.int64, device=device)  # on the device: NCCL reduces no CPU tensor\n"
        "for (x,) in loader:\n"
        "    x = x.to(device)  # the tensor the model gets: DDP would copy a CPU batch to the GPU, unmarked\n"
        "    torch._dynamo.mark_dynamic(x, 0)  # the batch size is symbolic: one graph for 4 and 3\n"
        "    ddp_model(x).sum().backward()\n"
        "    seen += len(x)  # the samples this batch really holds\n"
        "dist.all_reduce(seen)  # the sum over the ranks\n"
        "samples = int(seen)\n"
    ),
    hint="Mark the moved batch with `torch._dynamo.mark_dynamic(x, 0)`, and all_reduce the count.",
    setup=_last_batch_setup,
    observe=_last_batch_observe,
    expected=_last_batch_expected,
    mistakes=(
        Mistake(
            "09-last-batch-dropped",
            f"only {BATCH} of each rank's {PER_RANK} samples were trained on: drop_last=True drops the short batch.",
            _samples_in(lambda world: (BATCH, BATCH * world)),
            hint="Keep the short batch (drop_last=False) and mark the batch dimension dynamic.",
        ),
        Mistake(
            "09-last-batch-padded-counted",
            f"{2 * BATCH} samples counted per rank: the short batch's padding rows were counted.",
            _samples_in(lambda world: (2 * BATCH, 2 * BATCH * world)),
            hint="Count each batch's real rows only.",
        ),
        Mistake(
            "09-last-batch-padding-in-loss",
            f"the bias's gradient is {2 * BATCH}, not {PER_RANK}: the padding rows went into the loss.",
            _padding_in_loss,
            hint="Sum only the real rows' outputs: ddp_model(x)[:real].sum().",
        ),
        Mistake(
            "09-last-batch-marked-before-move",
            "Dynamo compiled twice although batches were marked: the mark was on the loader's tensor, not on "
            "the one x.to(device) made and ddp_model got.",
            _marked_before_move,
            hint="x = x.to(device) first, then torch._dynamo.mark_dynamic(x, 0).",
        ),
        Mistake(
            "09-last-batch-recompiled",
            "Dynamo compiled twice: the short last batch is a new shape for a graph guarded on the full size.",
            lambda seen, expected: all(s.get("compiles") == 2 for s in seen),
            hint="Call torch._dynamo.mark_dynamic(x, 0) on each batch before ddp_model(x).",
        ),
        Mistake(
            "09-last-batch-not-summed",
            f"each rank reported its own {PER_RANK} samples: no all_reduce added the ranks' counts.",
            lambda seen, expected: len(seen) > 1 and all(s.get("samples") == PER_RANK for s in seen),
            hint="After the loop, dist.all_reduce(seen).",
        ),
    ),
    covers=(),
)

EXERCISES = (SAVE, LAST_BATCH)
