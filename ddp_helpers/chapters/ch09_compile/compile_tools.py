"""Notebook 09's tools that find graph breaks and recompiles, each on a tiny case live ranks call (`eager` backend)."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_helpers.chapters.ch09_compile.compile_ddp import GraphCounter, batch, build, fresh_start


@contextlib.contextmanager
def dynamo_logs(**artifacts: bool) -> Iterator[list[str]]:
    """TORCH_LOGS's artifacts (recompiles=True ...) set in this process, their lines in the list at exit."""
    kept = logging.handlers.BufferingHandler(capacity=2**31)  # never full: a flush would drop the records
    messages: list[str] = []
    torch._logging.set_logs(**artifacts)  # type: ignore[arg-type]  # its keywords are each artifact
    swapped = []
    for name in list(logging.root.manager.loggerDict):
        logger = logging.getLogger(name)
        if name.startswith("torch") and logger.handlers:
            swapped.append((logger, list(logger.handlers)))
            logger.handlers = [kept]
    try:
        yield messages
    finally:
        messages += [record.getMessage() for record in kept.buffer]
        for logger, handlers in swapped:
            logger.handlers = handlers
        torch._logging.set_logs()  # back to the defaults: warnings only


def step_with_print(x: torch.Tensor) -> torch.Tensor:
    x = x * 2
    print("step_with_print: a print() in the middle")  # Dynamo cannot trace print(): a graph break
    return x + 1


def add(x: torch.Tensor, n: int) -> torch.Tensor:
    # with dynamic=False, Dynamo bakes each int n into its graph (a guard n == 3): a new n recompiles
    return x + n


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def debugging_tools(width: int) -> dict[str, Any]:
    """explain(), fullgraph=True, the three logs and the recompile limit, each on a tiny case."""
    return {**breaks_and_recompiles(), **ddp_graph_pieces(width), **recompile_limit()}


def breaks_and_recompiles() -> dict[str, Any]:
    """explain() and the graph_breaks log on a print(), fullgraph=True's refusal, the recompiles log."""
    fresh_start()
    with dynamo_logs(graph_breaks=True) as breaks:
        explained = torch._dynamo.explain(step_with_print)(torch.ones(3))
    fresh_start()
    try:
        torch.compile(step_with_print, fullgraph=True, backend="eager")(torch.ones(3))
        fullgraph = "no error"
    except Exception as error:  # the refusal is the lesson
        fullgraph = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    fresh_start()
    shaped = torch.compile(double, backend="eager", dynamic=False)
    with dynamo_logs(recompiles=True) as recompiles:
        shaped(torch.ones(2))
        shaped(torch.ones(3))  # another shape: the guard on the size fails, Dynamo compiles again
    return {
        "explain": {
            "graphs": explained.graph_count,
            "breaks": explained.graph_break_count,
            "reason": str(explained.break_reasons[0].reason).splitlines()[0],
        },
        "graph_breaks_log": [m.splitlines()[0] for m in breaks if "raph break" in m],
        "fullgraph": fullgraph,
        "recompiles": [m.splitlines()[-1].strip() for m in recompiles if "Recompiling function" in m],
    }


def ddp_graph_pieces(width: int) -> dict[str, Any]:
    """The ddp_graphs log of one DDP(torch.compile(model)) step: the pieces in DDPOptimizer's split graph."""
    fresh_start()
    pieces = GraphCounter("eager")
    model = DDP(torch.compile(build(width, 4), backend=pieces), bucket_cap_mb=1)
    with dynamo_logs(ddp_graphs=True) as ddp_graphs:
        model(batch(width)).sum().backward()
    return {
        "ddp_graphs_pieces": [m.count("---submod_") for m in ddp_graphs if "---split graph---" in m],
        "ddp_subgraphs": len(pieces.graphs),
    }


def recompile_limit() -> dict[str, Any]:
    """add() called with n = 0, 1, ... past the recompile limit: the graphs compiled, the warning, the results."""
    fresh_start()
    counter, limit = GraphCounter("eager"), torch._dynamo.config.recompile_limit
    added = torch.compile(add, backend=counter, dynamic=False)
    with dynamo_logs() as warnings:
        results = [float(added(torch.zeros(1), n)) for n in range(limit + 2)]
    return {
        "limit": limit,
        "limit_graphs": len(counter.graphs),
        "limit_results": results,
        "limit_warnings": [m.splitlines()[0] for m in warnings if "hit config." in m],
    }
