"""Live ranks: real torchrun ranks on gloo that keep their state between cells."""

from __future__ import annotations

import _thread
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import papermill
import psutil
import pytest
import torch
from conftest import assert_no_processes_left
from fixtures import module_live_ranks

import ddp_helpers
from ddp_helpers import (
    InvalidLaunchArguments,
    LaunchInterrupted,
    LaunchTimeout,
    RankError,
    RanksNotRunning,
    WorkerFailed,
)
from ddp_helpers.kernel.live import live_magics as live_magics

# Its module-scoped fixture starts a job: with `--dist loadgroup` one xdist worker runs the whole
# module, so the job starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_live_ranks")


ranks = module_live_ranks(nproc=2)  # one pair of ranks for the tests that leave them healthy


def test_each_live_rank_draws_its_own_seeds(ranks):
    # fresh interpreters, as torchrun starts them: a forked rank would share the others' seeds
    seen = ranks.run("(hash('parameter.weight'), torch.initial_seed())")
    assert seen[0][0] != seen[1][0] and seen[0][1] != seen[1][1], seen


def test_state_persists_per_rank_and_values_come_back(ranks):
    ranks.run("x = torch.ones(1) * (rank + 1)\ndist.all_reduce(x)")
    assert ranks.run("x.item()") == {0: 3.0, 1: 3.0}
    ranks.run("mine = rank * 10")  # each rank binds its own value
    assert ranks.run("mine + 1") == {0: 1, 1: 11}
    assert ranks.run("mine = 5", ranks=[1]) == {1: None}
    assert ranks.gather("mine") == [0, 5]
    gathered = ranks.gather("x")
    assert all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in gathered)
    ranks.push(lr=0.25)
    assert ranks.run("lr * world_size") == {0: 0.5, 1: 0.5}
    names = ranks.run(
        "sorted(k for k in ('torch', 'dist', 'nn', 'rank', 'local_rank', 'world_size', "
        "'device') if k in globals())"
    )
    assert names[0] == sorted(["torch", "dist", "nn", "rank", "local_rank", "world_size", "device"])


def test_output_streams_with_rank_prefixes_stderr_included(ranks, capsys):
    ranks.run("import sys\nprint('out of', rank)\nprint('err of', rank, file=sys.stderr)")
    captured = capsys.readouterr()
    for rank in (0, 1):
        assert f"[rank {rank}] out of {rank}" in captured.out
        assert f"[rank {rank}] err of {rank}" in captured.err
    logs = sorted(ranks.run_dir.glob("logs/*/attempt_0/1/stderr.log"))
    assert logs and "err of 1" in logs[0].read_text()  # every line is kept in the rank's log file


def test_an_exception_on_one_rank_fails_the_cell_and_keeps_the_ranks(ranks):
    with pytest.raises(RankError) as caught:
        ranks.run("before = rank\nif rank == 1:\n    1 / 0\nafter = rank")
    message = str(caught.value)
    assert message.splitlines()[0] == "rank 1 failed: ZeroDivisionError: division by zero"
    assert "line 3, in <module>" in message and "1 / 0" in message  # the cell's own line numbers
    assert caught.value.ranks == [1]
    assert ranks.run("before") == {0: 0, 1: 1}  # alive, with their state
    assert ranks.run("'after' in globals()") == {0: True, 1: False}


def test_an_interrupt_ends_the_cell_on_every_rank_and_keeps_them(ranks):
    threading.Timer(1.5, _thread.interrupt_main).start()  # what Jupyter's interrupt does to the kernel
    started = time.monotonic()
    with pytest.raises(LaunchInterrupted, match="process group is usable"):
        ranks.run("import time\nwhile True:\n    time.sleep(0.05)", timeout=None)
    assert time.monotonic() - started < 15
    assert ranks.run("torch.ones(1).sum().item()") == {0: 1.0, 1: 1.0}


def test_bad_input_is_refused_before_anything_is_sent(ranks):
    for bad in ([5], [], "0", True, [0, 1.0]):  # outside the world, none, a string, a bool, a float
        with pytest.raises(InvalidLaunchArguments, match="world size 2"):
            ranks.run("1", ranks=bad)
    with pytest.raises(InvalidLaunchArguments, match="timeout"):
        ranks.run("1", timeout=float("nan"))
    with pytest.raises(SyntaxError):
        ranks.run("def broken(:")
    with pytest.raises(NameError, match=r"^name 'no_such_name' is not defined on rank"):  # said once
        ranks.gather("no_such_name")
    with pytest.raises(InvalidLaunchArguments):
        ranks.push()
    assert ranks.run("rank") == {0: 0, 1: 1}


def test_a_hang_names_the_stuck_rank_and_its_line_then_restart_and_a_death(tmp_path, monkeypatch):
    live = ddp_helpers.start_ranks(nproc=2, backend="gloo", run_dir=tmp_path / "r", timeout=3)
    try:
        with pytest.raises(LaunchTimeout) as caught:
            live.run("x = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)  # rank 1 never joins")
        message = str(caught.value)
        assert "rank(s) 0 printed nothing for 3s" in message
        assert "ranks that finished the cell: 1" in message
        assert '"<cell' in message and "dist.all_reduce(x)" in message  # the line it waits on
        assert "all_reduce" in message.split("rank 0 is waiting here")[1]
        assert caught.value.silent_ranks == [0]
        assert "ranks.restart()" in message and not live.alive  # blocked in C++: stopped, not left hanging

        live.restart()
        assert live.run("rank") == {0: 0, 1: 1}
        with pytest.raises(WorkerFailed) as died:
            live.run("import os, time\nif rank == 1:\n    os._exit(3)\ntime.sleep(60)")
        assert died.value.rank == 1 and died.value.exitcode == 3
        assert "%ranks restart" in str(died.value)
        with pytest.raises(RanksNotRunning, match=r"not running .* `%ranks restart`"):  # the same advice
            live.run("1")
        monkeypatch.setattr(live_magics, "_current", live)  # what %%ranks finds in the kernel now
        with pytest.raises(RanksNotRunning, match=r"not running .* `%ranks restart`"):
            live_magics.current_ranks()
        live_magics.RanksMagics(shell=None)._line(argparse.Namespace(action="restart"))  # the advice works
        assert live.run("rank") == {0: 0, 1: 1}
    finally:
        live.shutdown()
    assert_no_processes_left(str(tmp_path))


KERNEL = """
import sys, ddp_helpers

ranks = ddp_helpers.start_ranks(nproc=2, backend="gloo", run_dir=sys.argv[1])
ranks.run("import time")
print(" ".join(str(pid) for pid in ranks.pids.values()), flush=True)
ranks.run("time.sleep(600)", ranks=[0])  # rank 0 busy in a cell, rank 1 idle, when the kernel dies
"""


def test_no_rank_outlives_a_killed_kernel(tmp_path):
    # where the kernel makes the folder of its socket: short, since a socket's path has at most 107 bytes
    temp = Path(tempfile.mkdtemp(prefix="ddp-test-"))
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL, str(tmp_path / "r")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert kernel.stdout is not None
    try:
        pids = [int(p) for p in kernel.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        time.sleep(1)
        kernel.send_signal(signal.SIGKILL)  # no atexit, no cleanup: only the ranks' own watch
        kernel.wait()
        deadline = time.monotonic() + 15
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_running(p) for p in pids)
        assert_no_processes_left(str(tmp_path), wait_s=10)
        assert [p.name for p in temp.iterdir()] == []  # the kernel removed the socket's folder in time
    finally:
        kernel.kill()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_socket_path_too_long_is_refused_clearly_and_leaves_nothing(tmp_path, monkeypatch):
    long = tmp_path / ("x" * 100)  # TMPDIR: the socket's path would pass the 107 bytes Linux allows
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    with pytest.raises(OSError, match="set TMPDIR to a shorter folder"):
        ddp_helpers.start_ranks(2, backend="gloo", show_ranks="none", run_dir=tmp_path / "r")
    assert list(long.iterdir()) == []  # the socket's folder is gone, and no process was started


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_ranks_magic_runs_under_papermill(tmp_path):
    cells = [
        "import ddp_helpers\n%load_ext ddp_helpers",
        "%ranks start --nproc 2 --backend gloo",
        "%%ranks\ny = torch.tensor([float(rank + 1)])\ndist.all_reduce(y)\ny.item()",
        "%%ranks --rank 1\nprint('only', rank)",
        "assert [t.item() for t in ranks.gather('y')] == [3.0, 3.0]",
        "%ranks start --nproc 2 --backend gloo",  # a second start replaces the ranks, and says so
        "%%ranks\nif rank == 1:\n    raise ValueError('bad shard')",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    source = tmp_path / "ranks.ipynb"
    nbformat.write(nb, source)
    env_runs = os.environ.get("DDP_HELPERS_RUNS_DIR")
    assert env_runs and str(tmp_path) in env_runs  # so the ranks' processes carry this test's folder
    with pytest.raises(papermill.PapermillExecutionError) as caught:
        papermill.execute_notebook(
            str(source),
            str(tmp_path / "out.ipynb"),
            kernel_name="python3",
            progress_bar=False,
            cwd=str(tmp_path),
        )
    assert caught.value.ename == "RankError" and "rank 1 failed: ValueError: bad shard" in caught.value.evalue
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    outputs = {c.source: "".join(o.get("text", "") for o in c.get("outputs", [])) for c in executed.cells}
    assert "[rank 0] Out: 3.0" in outputs[nb.cells[2].source]
    assert "[rank 1] Out: 3.0" in outputs[nb.cells[2].source]
    assert "[rank 1] only 1" in outputs[nb.cells[3].source] and "[rank 0]" not in outputs[nb.cells[3].source]
    started = outputs[nb.cells[1].source]  # the seconds of start-up are announced, then what started
    assert started.index("starting the live ranks") < started.index("2 live rank(s) on gloo"), started
    restarted = outputs[nb.cells[5].source]
    assert "stopped the 2 live rank(s) that were running: every variable they held is gone" in restarted
    assert_no_processes_left(str(tmp_path), wait_s=15)  # the kernel's exit took the ranks with it


def test_a_file_imported_on_every_rank_is_a_module_its_dataclasses_can_pickle_from(ranks, tmp_path):
    worker = tmp_path / "tiny_worker.py"
    worker.write_text(
        "import dataclasses\n\n"
        "@dataclasses.dataclass\nclass Point:\n    x: int\n\n"
        "def main(argv):\n    return Point(len(argv))\n"
    )
    ranks.import_file(worker)  # bound as `tiny_worker`, registered in sys.modules under that name
    assert ranks.run("tiny_worker.main(['a', 'b']).x") == {0: 2, 1: 2}
    # a dataclass instance pickles only if its module is found by name (PicklingError otherwise)
    same = "import pickle; pickle.loads(pickle.dumps(tiny_worker.Point(1))) == tiny_worker.Point(1)"
    assert ranks.run(same) == {0: True, 1: True}
    ranks.import_file(worker, "renamed")
    assert ranks.run("renamed.__name__") == {0: "renamed", 1: "renamed"}
    with pytest.raises(InvalidLaunchArguments, match="takes a .py file"):
        ranks.import_file(tmp_path / "missing.py")
    with pytest.raises(InvalidLaunchArguments, match="not a module name"):
        ranks.import_file(worker, "not-a-name")


def test_call_runs_a_named_function_with_real_arguments_and_rank_side_variables(ranks, tmp_path):
    worker = tmp_path / "called_worker.py"
    worker.write_text(
        "import os\n\n"
        "def main(argv, scale=1):\n"
        "    return [a * scale for a in argv], os.environ.get('CALLED_FLAG')\n"
    )
    ranks.import_file(worker)
    assert ranks.call("called_worker.main", [1, 2], scale=3) == {0: ([3, 6], None), 1: ([3, 6], None)}
    ranks.run("mine = torch.full((2,), float(rank))")  # a rank's own value, never in the kernel
    summed = ranks.call("torch.sum", ddp_helpers.OnRank("mine"))
    assert {r: v.item() for r, v in summed.items()} == {0: 0.0, 1: 2.0}
    # environ holds for the call only, on the ranks chosen only
    seen = ranks.call("called_worker.main", [], ranks=1, environ={"CALLED_FLAG": "yes"})
    assert seen == {1: ([], "yes")}
    assert ranks.run("__import__('os').environ.get('CALLED_FLAG')") == {0: None, 1: None}
    # an importable dotted name needs no import on the ranks first
    assert ranks.call("os.path.basename", "/a/b.txt") == {0: "b.txt", 1: "b.txt"}


def test_call_refuses_bad_targets_and_names_what_a_rank_lacks(ranks):
    for bad in ("train.main()", "", "a..b", 3):
        with pytest.raises(InvalidLaunchArguments, match="dotted name"):
            ranks.call(bad)
    with pytest.raises(InvalidLaunchArguments, match="environ"):
        ranks.call("os.getpid", environ={"X": 1})
    with pytest.raises(InvalidLaunchArguments, match="world size 2"):
        ranks.call("os.getpid", ranks=[5])
    with pytest.raises(RankError, match="no_such_module"):
        ranks.call("no_such_module.main")
    with pytest.raises(RankError, match=r"OnRank\('nothing_here'\)"):
        ranks.call("len", ddp_helpers.OnRank("nothing_here"))
    with pytest.raises(ValueError, match="variable name"):
        ddp_helpers.OnRank("not a name")
    assert ranks.call("len", "abc") == {0: 3, 1: 3}  # the ranks are fine after each
