"""Live ranks' two ends: the typed messages, the rank's answers, the kernel's one receive loop.

No torchrun here: the server's `handle` runs in this process, and `receive` reads real pipes.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle
import subprocess
import sys
import time
from multiprocessing import Pipe

import pytest
import torch
from conftest import REPO

from ddp_helpers.kernel.live.ranks import receive
from ddp_helpers.rank.distributed import DistInfo
from ddp_helpers.rank.live_protocol import Error, Exited, Interrupted, Run, Value

KERNEL_SIDE = (
    "ddp_helpers.kernel.launcher",
    "ddp_helpers.kernel.lab",
    "ddp_helpers.kernel.live.ranks",
)


def _modules_after_import(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_protocol_imports_nothing_of_either_side():
    ours = [m for m in _modules_after_import("ddp_helpers.rank.live_protocol") if m.startswith("ddp_helpers")]
    assert ours == [
        "ddp_helpers",
        "ddp_helpers.errors",
        "ddp_helpers.rank",
        "ddp_helpers.rank.live_protocol",
    ]


def test_the_rank_server_imports_nothing_of_the_kernel_side():
    source = (REPO / "ddp_helpers" / "rank" / "live_server.py").read_text()
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert {m for m in imported if m.startswith("ddp_helpers")} == {
        "ddp_helpers.rank.distributed",
        "ddp_helpers.rank.live_protocol",
    }
    loaded = _modules_after_import("ddp_helpers.rank.live_server")
    assert not [m for m in loaded if m.startswith(KERNEL_SIDE)]
    assert "psutil" not in loaded  # the kernel side's dependency


def test_messages_are_frozen_and_travel_whole():
    messages = [
        (1, 4321),
        Run(3, "x = 1"),
        Run(5, "", pickle.dumps({"lr": 0.1})),
        None,
        Value(3, None, "None"),
        Error(3, "ValueError: bad", "Traceback ..."),
        Interrupted(3),
        Exited(3, 7),
    ]
    kernel, rank = Pipe()
    for message in messages:
        rank.send(message)
        assert kernel.recv() == message
    run = messages[1]
    assert isinstance(run, Run)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.code = "y = 2"  # type: ignore[misc]  # deliberately: a frozen field refuses assignment


@pytest.fixture
def cells(monkeypatch):
    from ddp_helpers.rank import live_server as server

    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])  # Cells makes its own __main__
    info = DistInfo(
        rank=0, local_rank=0, world_size=1, local_world_size=1, backend="none", device=torch.device("cpu")
    )
    return server.Cells(info)


def test_the_server_answers_each_request_with_its_typed_reply(cells):
    from ddp_helpers.rank.live_server import handle

    assert handle(cells, Run(1, "x = 2\nx * 21")) == Value(1, pickle.dumps(42), "42")
    failed = handle(cells, Run(2, "y = 1\n1 / 0"))
    assert isinstance(failed, Error) and failed.error == "ZeroDivisionError: division by zero"
    assert 'File "<cell 2>", line 2' in failed.traceback and "1 / 0" in failed.traceback
    assert handle(cells, Run(3, "raise KeyboardInterrupt")) == Interrupted(3)
    assert isinstance(handle(cells, Run(4, "raise SystemExit(1)")), Error)  # a cell never ends the rank
    unbound = handle(cells, Run(5, "nope"))
    assert isinstance(unbound, Error) and unbound.error == "NameError: name 'nope' is not defined"
    assert handle(cells, Run(6, "", pickle.dumps({"lr": 0.5}))) == Value(6, pickle.dumps(None), "None")
    gathered = handle(cells, Run(7, "lr"))
    assert isinstance(gathered, Value) and gathered.data is not None, gathered
    assert pickle.loads(gathered.data) == 0.5
    unpicklable = handle(cells, Run(8, "import threading\nthreading.Lock()"))
    assert isinstance(unpicklable, Value), unpicklable
    assert unpicklable.data is None and unpicklable.text.startswith("<unlocked _thread.lock")


def test_one_receive_loop_yields_replies_and_closed_connections():
    kernel0, rank0 = Pipe()
    kernel1, rank1 = Pipe()
    rank0.send(Value(1, None, "None"))
    rank1.close()  # rank 1 died
    pending = {0, 1}
    got = dict(receive({0: kernel0, 1: kernel1}, pending, deadline=time.monotonic() + 5))
    assert got == {0: Value(1, None, "None"), 1: None} and not pending


def test_the_receive_loop_keeps_waiting_ranks_pending_at_its_deadline():
    kernel0, rank0 = Pipe()
    pending, checks = {0}, []
    started = time.monotonic()
    assert list(receive({0: kernel0}, pending, time.monotonic() + 0.2, lambda: checks.append(1))) == []
    assert pending == {0} and len(checks) >= 2 and time.monotonic() - started < 2
    rank0.send(Error(1, "RuntimeError: x", ""))
    for rank, reply in receive({0: kernel0}, pending, time.monotonic() + 5):
        assert (rank, reply) == (0, Error(1, "RuntimeError: x", ""))
        break  # a caller that stops at a reply leaves its rank pending
    assert pending == {0}


def test_a_check_between_waits_may_end_the_loop():
    kernel0, _rank0 = Pipe()

    def rank_died() -> None:
        raise RuntimeError("torchrun ended")

    with pytest.raises(RuntimeError, match="torchrun ended"):
        list(receive({0: kernel0}, {0}, None, rank_died))


def test_a_cells_values_come_in_rank_order_whichever_rank_replied_first():
    import pickle

    from ddp_helpers.kernel.live.results import cell_results
    from ddp_helpers.rank.live_protocol import Reply, Value

    replies: dict[int, Reply] = {
        rank: Value(7, pickle.dumps(rank * 10), repr(rank * 10)) for rank in (2, 0, 1)
    }  # as they came
    results = cell_results(replies)
    assert list(results) == [0, 1, 2] and list(results.values()) == [0, 10, 20]
