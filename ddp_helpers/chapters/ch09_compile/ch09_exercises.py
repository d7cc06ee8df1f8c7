"""Notebook 09's exercises: save a compiled DDP model with plain keys, and a short last batch that
compiles once and still counts every sample.

Compiling stays tiny: `DDP(torch.compile(model))` as the notebook teaches, with the "eager" backend
(Dynamo traces, torch's own kernels run) or a counting backend that records each graph Dynamo hands it
and returns it uncompiled. Each setup calls `torch._dynamo.reset()`, so that what Dynamo learned in one
check (a batch size it saw, which makes the next compile dynamic by itself) never helps the next.

In 09-last-batch the answer's `device` is cpu:0 on a CPU, so that `x.to(device)` copies the loader's batch
as a move to a GPU does, and the probe watches torch._dynamo.mark_dynamic: a mark made before the move is
on a tensor the model never gets, and is named for it.
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
            except Exception as error:  # e.g. not tensors: torch.load (weights_only) refuses the object
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
    task=(
        "`ddp_model` is `DDP(torch.compile(model))`. After the step, let rank 0 save to `save_path` a "
        "`state_dict` whose keys are the plain model's (`weight`): no `module.` from DDP, no `_orig_mod.` "
        "from `torch.compile`, so that a model without either loads it."
    ),
    given="`ddp_model` (DDP around a compiled Linear), `optimizer` (SGD, lr 1), `x`, `save_path`, `rank`",
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
    hint=(
        "Two wrappers, two prefixes: DDP keeps the module it wraps as `.module`, and the `OptimizedModule` "
        "that `torch.compile` returns keeps the model it compiled as `._orig_mod`. The plain model's "
        "`state_dict()` has neither (the model you compiled is that same object)."
    ),
    setup=_save_setup,
    observe=_save_observe,
    expected=_save_expected,
    mistakes=(
        Mistake(
            "09-save-module-keys",
            "the saved keys start with 'module.': that is the DDP wrapper's state_dict (and under it "
            "'_orig_mod.'); a plain model refuses them. Save ddp_model.module._orig_mod.state_dict()",
            _keys_start("module."),
            hint=(
                "Save the plain model's state_dict: ddp_model.module._orig_mod.state_dict() (.module unwraps "
                "DDP, ._orig_mod unwraps torch.compile)."
            ),
        ),
        Mistake(
            "09-save-orig-mod-keys",
            "the saved keys start with '_orig_mod.': that is the compiled module's state_dict; a plain model "
            "refuses them. Go one level further in: ddp_model.module._orig_mod.state_dict()",
            _keys_start("_orig_mod."),
            hint="Unwrap the compiled module as well: ddp_model.module._orig_mod.state_dict().",
        ),
        Mistake(
            "09-save-not-saved",
            "rank 0 wrote no file at save_path",
            lambda seen, expected: seen[0].get("file_keys") is None and not seen[0].get("error"),
            hint="Let rank 0 call torch.save(state, save_path), to exactly that path.",
        ),
        Mistake(
            "09-save-every-rank",
            "every rank called torch.save (see saved): N writers where one is enough. To one path they "
            "race, on a shared filesystem too, and the file ends as whichever write finished last, or torn",
            lambda seen, expected: len(seen) > 1 and all((s.get("saved") or 0) >= 1 for s in seen),
            hint="Keep the step on every rank and put the torch.save alone under `if rank == 0:`.",
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
    # on a CPU, the device with its index (cpu:0), as a GPU's is cuda:N: torch.device("cpu", 0) is not
    # torch.device("cpu"), so x.to(device) makes a new tensor here as the move to a GPU does, where
    # x.to("cpu") would hand back the loader's own tensor, and a mark made on it before the move would stick
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
    """Each tensor the answer gives torch._dynamo.mark_dynamic (weakly), and, per forward, whether the
    tensor ddp_model got was one of them. The observe puts the real mark_dynamic back."""
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
    """The dataset every rank builds (the same seed), as setup builds it."""
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
    # the loss is each batch's summed output; DDP averages each backward over the ranks, and .grad adds the
    # batches up: the weight's gradient is the sum of every real sample over the world, the bias's PER_RANK
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
    """Two compiles, marks made, and no forward got a marked tensor: the mark was made before the move."""
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
        f"Each rank's shard of `dataset` holds {PER_RANK} samples: batches of {BATCH} leave a short last one. "
        "Loop once over a loader of this rank's shard through the compiled `ddp_model` so that Dynamo compiles "
        "**once**, every sample is trained on, and `samples` ends as the number of samples all ranks trained "
        "on together (padding rows, if you pad, do not count)."
    ),
    given=(
        "`ddp_model` (`DDP(torch.compile(model))`, with a backend that counts compiles), `dataset`, "
        "`batch_size`, `DataLoader`, `DistributedSampler`, `dist`, `device` (on a CPU `cpu:0`, not `cpu`, so "
        "that `x.to(device)` makes a new tensor, as a move to a GPU does)"
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
    hint=(
        "`drop_last=True` compiles once by never training on the short batch. Dynamo guards each graph on "
        "the shapes it saw; `torch._dynamo.mark_dynamic(x, 0)` before the call (on the tensor the model gets: "
        "moved to the device first) compiles the batch dimension "
        "as a symbol, and one graph then serves both sizes (or pad the short batch to full size, and count, "
        "and weigh, only its real rows). Each rank counts its own shard: an all_reduce adds them up."
    ),
    setup=_last_batch_setup,
    observe=_last_batch_observe,
    expected=_last_batch_expected,
    mistakes=(
        Mistake(
            "09-last-batch-dropped",
            f"one compile, but only {BATCH} of each rank's {PER_RANK} samples were trained on: drop_last=True "
            "throws the short last batch away every epoch",
            _samples_in(lambda world: (BATCH, BATCH * world)),
            hint=(
                "Keep the short batch (drop_last=False) and call torch._dynamo.mark_dynamic(x, 0) on each "
                "batch before the model sees it: one graph then serves both sizes."
            ),
        ),
        Mistake(
            "09-last-batch-padded-counted",
            f"one compile, but {2 * BATCH} samples counted per rank: the padding rows of the short batch were "
            "counted as samples (count, and weigh in the loss, only the real rows)",
            _samples_in(lambda world: (2 * BATCH, 2 * BATCH * world)),
            hint=(
                "Count each batch's real rows only (the short batch's size before any padding), and sum only "
                "their outputs in the loss."
            ),
        ),
        Mistake(
            "09-last-batch-padding-in-loss",
            f"one compile and the right count, but the bias's gradient is {2 * BATCH}, not {PER_RANK}: the short "
            "batch's padding rows went into the loss. A zero row adds nothing to the weight's gradient, but it "
            "still outputs the bias, which learns from it as from a sample. Weigh only the real rows: slice "
            "the output to them (or multiply by a mask) before the sum",
            _padding_in_loss,
            hint=(
                "Sum only the real rows' outputs: ddp_model(x)[:real].sum(), or the output times a 0/1 mask "
                "of the real rows."
            ),
        ),
        Mistake(
            "09-last-batch-marked-before-move",
            "Dynamo compiled twice although torch._dynamo.mark_dynamic was called on the batches: the tensor "
            "marked was never the one ddp_model got. x.to(device) makes a new tensor (here as on a GPU), "
            "and the mark stays on the loader's tensor, so the short batch met a graph guarded on the full size",
            _marked_before_move,
            hint=(
                "Mark the tensor the model gets: x = x.to(device) first, then torch._dynamo.mark_dynamic(x, 0), "
                "then ddp_model(x)."
            ),
        ),
        Mistake(
            "09-last-batch-recompiled",
            "Dynamo compiled twice: the short last batch is a new shape, and the graph compiled for the full "
            "batch is guarded on its size. Mark the batch dimension dynamic before the first call",
            lambda seen, expected: all(s.get("compiles") == 2 for s in seen),
            hint=(
                "Call torch._dynamo.mark_dynamic(x, 0) on each batch after x.to(device) and before "
                "ddp_model(x): Dynamo then compiles the batch size as a symbol."
            ),
        ),
        Mistake(
            "09-last-batch-not-summed",
            f"each rank reported its own {PER_RANK} samples: the count is per rank until an all_reduce adds "
            "the ranks' counts up",
            lambda seen, expected: len(seen) > 1 and all(s.get("samples") == PER_RANK for s in seen),
            hint="After the loop, dist.all_reduce(seen) (SUM) adds up every rank's count.",
        ),
    ),
    covers=(),
)

EXERCISES = (SAVE, LAST_BATCH)
