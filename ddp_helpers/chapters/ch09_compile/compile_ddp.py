"""Notebook 09's experiments: torch.compile with DDP, each a function that live ranks call and whose dict the
notebook checks. Each resets Dynamo first; `GraphCounter` counts the graphs Dynamo hands a backend."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import torch
import torch._inductor.config
import torch.distributed as dist
import torch.nn as nn
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# ---------------------------------------------------------------------------- the models
device = torch.device("cpu")  # this rank's device: the notebook sets it (use_device) on GPUs


def use_device(rank_device: torch.device) -> None:
    global device
    device = rank_device


class MLP(nn.Module):
    """`depth` square Linear layers with ReLU: each layer is one DDP gradient of width*(width+1) floats."""

    def __init__(self, width: int, depth: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class ChattyMLP(MLP):
    """The same MLP, with a log line after its first layer that only rank 0 prints: rank-dependent Python."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.layers[0](x))
        if dist.get_rank() == 0:  # Dynamo cannot trace print(): rank 0's graph breaks here
            print(f"after layer 0: activations {tuple(x.shape)}")
        for layer in self.layers[1:]:
            x = torch.relu(layer(x))
        return x


def build(width: int, depth: int, chatty: bool = False) -> MLP:
    torch.manual_seed(0)  # the same weights on every rank (DDP broadcasts rank 0's anyway)
    return (ChattyMLP if chatty else MLP)(width, depth).to(device)


class GraphCounter:
    """A torch.compile backend that records each graph Dynamo compiles, then hands it to `backend`."""

    def __init__(self, backend: str = "aot_eager"):
        self.backend = backend
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs.append(gm)
        return lookup_backend(self.backend)(gm, example_inputs)


def fresh_start() -> None:
    """Forget every compiled graph and counter, so that one experiment's compiles are its own."""
    torch._dynamo.reset()
    counters.clear()


def graph_breaks() -> dict[str, int]:
    """Dynamo's graph-break reasons so far, each cut to its first line (the break's type), with how often."""
    return {reason.splitlines()[0][:160]: n for reason, n in counters["graph_break"].items()}


def graph_break_sites() -> list[str]:
    """Each graph break's "Developer debug context" line: the call Dynamo could not trace."""
    return sorted(
        {
            line.strip()
            for reason in counters["graph_break"]
            for line in reason.splitlines()
            if "debug context" in line
        }
    )


def batch(width: int, size: int = 16, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + dist.get_rank())  # each rank its own data
    return torch.randn(size, width, generator=generator).to(device)


# ---------------------------------------------------------------------------- where to compile
def wrap(model: nn.Module, order: str, counter: GraphCounter, bucket_cap_mb: float) -> nn.Module:
    """The two places to put torch.compile: around DDP, or inside it, around the plain model."""
    if order == "compile(DDP(model))":
        compiled = torch.compile(DDP(model, bucket_cap_mb=bucket_cap_mb), backend=counter)
    else:
        compiled = DDP(torch.compile(model, backend=counter), bucket_cap_mb=bucket_cap_mb)
    assert isinstance(compiled, nn.Module)  # torch.compile of a module is a module (typed as a Callable)
    return compiled


def compiled_step(order: str, width: int, depth: int, bucket_cap_mb: float) -> dict[str, Any]:
    """One forward and backward of a compiled DDP model: the graphs compiled, the breaks, the time."""
    fresh_start()
    counter = GraphCounter()
    model = wrap(build(width, depth), order, counter, bucket_cap_mb)
    start = time.perf_counter()
    model(batch(width)).sum().backward()
    return {
        "order": order,
        "bucket_cap_mb": bucket_cap_mb,
        "subgraphs": len(counter.graphs),
        "graph_breaks": graph_breaks(),
        "break_sites": graph_break_sites(),
        "first_step_s": time.perf_counter() - start,
        "layer_bytes": [
            sum(p.numel() * p.element_size() for p in layer.parameters())
            for layer in build(width, depth).layers
        ],
        "first_bucket_bytes": dist._DEFAULT_FIRST_BUCKET_BYTES,
    }


def first_bucket_failure(width: int, depth: int, bucket_cap_mb: float) -> dict[str, str]:
    """A bucket cap below DDP's 1 MiB first bucket: DDPOptimizer refuses it when Dynamo compiles."""
    try:
        compiled_step("DDP(compile(model))", width, depth, bucket_cap_mb)
    except Exception as error:  # the failure is the lesson: say which, and let the notebook check it
        return {"type": type(error).__name__, "message": str(error).splitlines()[0]}
    return {"type": "", "message": "no error"}


# ---------------------------------------------------------------------------- compiled autograd
def compiled_autograd_step(width: int, depth: int, python_reducer: bool = True) -> dict[str, Any]:
    """One training step under compiled autograd, with DDP's Python reducer (or its C++ Reducer)."""
    fresh_start()
    mode: dict[str, Any] = {"compiled_autograd": True}  # a backward() in a compiled function is traced too
    if python_reducer:
        mode["optimize_ddp"] = "python_reducer"
    # under the Python reducer DDP's constructor sets these two and Dynamo's inline list: put back after
    fused = {
        k: getattr(torch._inductor.config, k) for k in ("_fuse_ddp_communication", "_fuse_ddp_bucket_size")
    }
    inlined = set(torch._dynamo.trace_rules.LEGACY_MOD_INLINELIST)
    error = ""
    with torch._dynamo.config.patch(**mode), torch._inductor.config.patch(**fused):
        try:
            counter = GraphCounter("eager")  # no AOTAutograd: compiled autograd traces the backward itself
            model = DDP(build(width, depth), bucket_cap_mb=1)

            @torch.compile(backend=counter)
            def train_step(x: torch.Tensor) -> None:
                model(x).sum().backward()

            start = time.perf_counter()
            try:
                train_step(batch(width))
            except RuntimeError as failure:  # a Reducer refusing compiled autograd: the notebook says which
                error = str(failure).splitlines()[0]
            first_step_s = time.perf_counter() - start
        finally:
            torch._dynamo.trace_rules.LEGACY_MOD_INLINELIST.intersection_update(inlined)
            torch._dynamo.trace_rules.get_legacy_mod_inlinelist.cache_clear()
    return {
        "error": error,
        "graphs": [len(gm.graph.nodes) for gm in counter.graphs],
        "all_reduces_per_graph": [
            sum("all_reduce" in str(n.target) for n in gm.graph.nodes) for gm in counter.graphs
        ],
        "captures": counters["compiled_autograd"]["captures"],
        "graph_breaks": graph_breaks(),
        **off_the_mean(model),
        "first_step_s": first_step_s,
    }


def off_the_mean(model: nn.Module) -> dict[str, Any]:
    """How far this rank's gradients are from their mean over the ranks (0 once DDP has averaged them)."""
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    mean = [g.clone() for g in grads]
    for g in mean:
        dist.all_reduce(g)
        g /= dist.get_world_size()
    return {
        "parameters": len(grads),
        "max_diff_from_mean": max(
            (float((g - m).abs().max()) for g, m in zip(grads, mean, strict=True)), default=0.0
        ),
        "max_grad": max((float(g.abs().max()) for g in grads), default=0.0),
    }


# ---------------------------------------------------------------------------- cost, and the same weights
def c_compiler() -> str | None:
    """The C++ compiler inductor would call on the CPU (its default is g++; $CXX overrides), or None."""
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def train(model: nn.Module, width: int, steps: int, lr: float = 0.05) -> list[float]:
    """SGD steps on each rank's own batches; the step times, first (compile included) to last."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    times = []
    for step in range(steps):
        x = batch(width, seed=100 + step)
        start = time.perf_counter()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()  # GPU kernels run asynchronously: time them to their end
        times.append(time.perf_counter() - start)
    return times


def eager_against_compiled(width: int, depth: int, steps: int, backend: str) -> dict[str, Any]:
    """The same DDP training, eager and DDP(torch.compile(model)): step times and the weights reached."""
    fresh_start()
    eager = DDP(build(width, depth))
    eager_times = train(eager, width, steps)
    model = build(width, depth)
    compiled = DDP(torch.compile(model, backend=backend))
    compiled_times = train(compiled, width, steps)
    with torch.no_grad():
        trained = list(
            zip(build(width, depth).parameters(), eager.module.parameters(), model.parameters(), strict=True)
        )
        moved = max(float((e - start).abs().max()) for start, e, _ in trained)  # how far eager training went
        diff = max(float((e - c).abs().max()) for _, e, c in trained)
    times = {"eager_s": eager_times, "compiled_s": compiled_times}
    return {"backend": backend, **times, "max_weight_diff": diff, "max_weight_change": moved}


# ---------------------------------------------------------------------------- recompiles
def epochs_of_batches(
    width: int, samples: int, batch_size: int, drop_last: bool, epochs: int = 2
) -> dict[str, Any]:
    """DDP(torch.compile(model)) over a DistributedSampler's shard: how many graphs the epochs compile."""
    fresh_start()
    counter = GraphCounter()
    model = DDP(torch.compile(build(width, 1), backend=counter))
    data = TensorDataset(torch.randn(samples, width))
    # pads so that every rank gets the same count
    sampler: DistributedSampler[Any] = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=drop_last)
    sizes, compiled_after = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for (x,) in loader:
            model(x.to(device)).sum().backward()
            sizes.append(len(x))
            compiled_after.append(len(counter.graphs))
    steps = {"batch_sizes": sizes, "graphs_after_each_step": compiled_after}
    return {"drop_last": drop_last, **steps, "shard": len(sampler)}


# ---------------------------------------------------------------------------- Python that differs by rank
def rank_dependent_step(width: int) -> dict[str, Any]:
    """ChattyMLP under DDP(torch.compile(...)): rank 0 runs a print() the other ranks do not."""
    fresh_start()
    counter = GraphCounter()
    model = DDP(torch.compile(build(width, 2, chatty=True), backend=counter))
    model(batch(width)).sum().backward()
    return {"subgraphs": len(counter.graphs), "graph_breaks": graph_breaks()}


# ---------------------------------------------------------------------------- checkpoints
def checkpoint_keys(width: int, folder: str) -> dict[str, Any]:
    """A compiled model's state_dict keys, a plain model refusing them, and the two fixes."""
    fresh_start()
    model = build(width, 2)
    compiled = torch.compile(model, backend="aot_eager")  # an OptimizedModule holding `model` as _orig_mod
    assert isinstance(compiled, nn.Module)  # torch.compile of a module is a module (typed as a Callable)
    ddp = DDP(compiled)
    train(ddp, width, steps=2)  # a compiled run, to checkpoint
    reference = ddp(batch(width, seed=7)).detach()
    keys = {
        "model": list(model.state_dict()),
        "compiled": list(compiled.state_dict()),
        "DDP(compiled)": list(ddp.state_dict()),
    }
    try:
        build(width, 2).load_state_dict(ddp.state_dict())
        refused = ""
    except RuntimeError as error:
        refused = str(error)
    # fix 1: strip the prefixes from a checkpoint that has them
    state = dict(ddp.state_dict())
    consume_prefix_in_state_dict_if_present(state, "module._orig_mod.")
    build(width, 2).load_state_dict(state)
    # fix 2: save the plain module's state_dict: `model`, which you kept (it is ddp.module._orig_mod)
    path = os.path.join(folder, "compiled-run.pt")
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    dist.barrier()  # every rank reads what rank 0 wrote
    return {
        "keys": keys,
        "refused": refused.splitlines()[0] if refused else "",
        "missing": "Missing key(s)" in refused,
        "unexpected": "Unexpected key(s)" in refused,
        "same_module": ddp.module._orig_mod is model,
        "reference": reference,
    }


@torch.no_grad()
def resume_both_ways(width: int, folder: str, reference: torch.Tensor) -> dict[str, Any]:
    """Compiled run -> eager resume, and eager run -> compiled resume, through plain state_dicts."""
    fresh_start()
    path = os.path.join(folder, "compiled-run.pt")
    eager = build(width, 2)  # the compiled run's weights, into a plain model
    eager.load_state_dict(torch.load(path, map_location=device, weights_only=True))
    x = batch(width, seed=7)
    eager_out = DDP(eager)(x)
    # the other way: an eager run's checkpoint into a model that is then compiled
    eager_path = os.path.join(folder, "eager-run.pt")
    if dist.get_rank() == 0:
        torch.save(eager.state_dict(), eager_path)
    dist.barrier()
    fresh = build(width, 2)  # load first, compile after
    fresh.load_state_dict(torch.load(eager_path, map_location=device, weights_only=True))
    compiled_out = DDP(torch.compile(fresh, backend="aot_eager"))(x)
    return {
        "eager_vs_saved": float((eager_out - reference).abs().max()),
        "compiled_vs_saved": float((compiled_out - reference).abs().max()),
    }
