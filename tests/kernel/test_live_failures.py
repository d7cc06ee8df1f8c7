"""Live ranks: each failure names its real cause, from what *this* cell did."""

from __future__ import annotations

import threading
import time

import pytest
from fixtures import module_live_ranks

import ddp_helpers
from ddp_helpers import LaunchInterrupted, RankError, WorkerFailed
from ddp_helpers.errors import ValueNotReturned
from ddp_helpers.kernel.launcher.diagnosis import NO_STDIN_HINT

# Its module-scoped fixture starts a job: with `--dist loadgroup` one xdist worker runs the whole
# module, so the job starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_live_failures")

PROMPT_S = 8.0  # a rank that left is reported this soon (the old report waited 13 s for torchrun)


ranks = module_live_ranks(nproc=2)


def test_a_rank_that_exits_is_reported_by_this_cell_and_its_code(ranks):
    with pytest.raises(RankError):  # history: an earlier cell's failure and stderr line
        ranks.run("import os, sys\nprint('an earlier cell wrote this', file=sys.stderr)\nraise SystemExit(0)")
    with pytest.raises(WorkerFailed) as died:
        ranks.run(
            "if rank == 1:\n    print('this cell wrote this', file=sys.stderr)\n    os._exit(3)\ntime = 1"
        )
    message = str(died.value)
    assert died.value.rank == 1 and died.value.exitcode == 3
    assert message.startswith("rank 1 exited with code 3 during the cell"), message
    assert "this cell wrote this" in message, message
    assert "SystemExit" not in message and "an earlier cell" not in message, message

    ranks.restart()
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as left:
        ranks.run("import os, time\nif rank == 0:\n    os._exit(0)\ntime.sleep(60)")
    assert time.monotonic() - started < PROMPT_S
    assert str(left.value).startswith("rank 0 exited with code 0 during the cell"), str(left.value)
    assert left.value.exitcode == 0 and not ranks.alive
    ranks.restart()


def test_a_value_that_cannot_come_back_raises_one_error_with_its_repr(ranks):
    ranks.run(
        "import threading\nclass Box:\n    def __repr__(self):\n        return f'Box({rank})'\n"
        "box = Box()\nlock = threading.Lock()"
    )
    for name, reason in (("box", "defined in a cell"), ("lock", "cannot be pickled")):
        with pytest.raises(ValueNotReturned) as caught:
            ranks.gather(name)
        assert caught.value.ranks == [0, 1]
        assert f"{name} cannot be brought back from rank(s) 0, 1" in str(caught.value)
        assert reason in str(caught.value)
    assert caught.value.reprs[0].startswith("<unlocked _thread.lock")
    assert "[rank 1] Box(1)" in str(pytest.raises(ValueNotReturned, ranks.gather, "box").value)
    assert repr(ranks.run("box")) == "[rank 0] Box(0)\n[rank 1] Box(1)"  # a cell's value: the same repr
    with pytest.raises(NameError, match="on rank\\(s\\) 0, 1"):
        ranks.gather("never_bound")


def test_breakpoint_in_a_cell_quits_at_once_and_says_that_a_rank_has_no_terminal(ranks):
    # a rank's stdin is /dev/null: pdb reads end-of-file and quits, the cell never waits for a prompt
    with pytest.raises(RankError) as caught:
        ranks.run("x = 1\nbreakpoint()")
    message = str(caught.value)
    assert message.startswith("rank 0 failed: BdbQuit"), message
    assert f"hint: {NO_STDIN_HINT}" in message and "ranks.where()" in message, message
    assert ranks.run("x") == {0: 1, 1: 1}  # the ranks carry on


def test_where_shows_each_rank_in_the_cell_where_it_waits_and_between_cells(ranks):
    # asked from a second thread while a cell blocks: rank 1 sleeps, rank 0 waits for it in all_reduce
    code = "import time\ny = torch.ones(1)\nif rank == 1:\n    time.sleep(4)\ndist.all_reduce(y)\ny.item()"
    results: list[object] = []
    cell = threading.Thread(target=lambda: results.append(ranks.run(code)))
    cell.start()
    deadline = time.monotonic() + 3.5
    stacks = ""
    while time.monotonic() < deadline and not ("all_reduce" in stacks and "time.sleep(4)" in stacks):
        stacks = ranks.where()
    cell.join()
    assert "rank 0, running" in stacks and "    dist.all_reduce(y)" in stacks, stacks
    assert "rank 1, running" in stacks and "    time.sleep(4)" in stacks, stacks
    assert results == [{0: 2.0, 1: 2.0}]
    assert ranks.where().splitlines() == [
        "rank 0: between cells (waiting for the next one)",
        "",
        "rank 1: between cells (waiting for the next one)",
    ]


def test_a_keyboard_interrupt_raised_by_a_cell_names_its_rank_and_keeps_the_ranks(ranks):
    with pytest.raises(
        LaunchInterrupted, match=r"interrupted on rank\(s\) 1: the cell raised KeyboardInterrupt"
    ):
        ranks.run("if rank == 1:\n    raise KeyboardInterrupt")
    assert ranks.run("rank") == {0: 0, 1: 1}


def test_matplotlib_in_a_rank_draws_off_screen_not_inline(tmp_path, monkeypatch):
    # what a Jupyter kernel puts in the environment its children inherit
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    with ddp_helpers.start_ranks(nproc=1, backend="gloo", run_dir=tmp_path / "r") as live:
        assert live.run("import matplotlib\nmatplotlib.get_backend().lower()") == {0: "agg"}


PEER_FAILED_S = 30.0  # the 5 s interrupt grace plus fresh ranks importing torch (15.0 s on a loaded 2-core machine), far short of gloo's 30-minute wait


def test_a_rank_that_raises_while_the_others_wait_in_a_collective_ends_the_cell(ranks):
    # before: rank 0 waited in all_reduce for gloo's 30-minute timeout, and the cell with it
    started = time.monotonic()
    with pytest.raises(RankError) as caught:
        ranks.run(
            "x = torch.ones(1)\nif rank == 1:\n    raise ValueError('rank 1 gave up')\ndist.all_reduce(x)"
        )
    message = str(caught.value)
    assert time.monotonic() - started < PEER_FAILED_S, message
    assert message.startswith("rank 1 failed: ValueError: rank 1 gave up"), message
    assert caught.value.ranks == [1], caught.value.ranks
    assert "rank 0 was still in the cell, waiting here" in message and "all_reduce" in message, message
    assert ranks.alive, "the next cell needs ranks"
    said_restarted = "Fresh ranks were started" in message
    assert said_restarted or "ranks are still running" in message, message
    assert ranks.run("x = torch.ones(1) * (rank + 1)\ndist.all_reduce(x)\nx.item()") == {0: 3.0, 1: 3.0}


def test_a_rank_that_raises_while_the_other_finishes_keeps_the_ranks(ranks):
    ranks.run("kept = rank + 10")
    with pytest.raises(RankError) as caught:
        ranks.run("if rank == 1:\n    raise KeyError('only here')\ny = 1")
    assert caught.value.ranks == [1] and "still in the cell" not in str(caught.value), str(caught.value)
    assert ranks.gather("kept") == [10, 11]  # nobody waited: no interrupt, no restart


@pytest.mark.parametrize("line", ["%time x = 1", "!ls", "    %timeit sum(range(3))"])
def test_a_magic_or_shell_escape_in_a_ranks_cell_is_named_before_anything_runs(ranks, line):
    # it was a bare "invalid syntax"
    with pytest.raises(SyntaxError) as caught:
        ranks.run(f"if True:\n{line}" if line.startswith(" ") else f"y = 2\n{line}")
    assert "a rank runs the cell as plain Python" in caught.value.msg, caught.value.msg
    assert caught.value.lineno == 2 and line.split()[0] in caught.value.msg


def test_a_collective_in_a_cell_on_some_ranks_only_is_warned_about_before_it_runs(ranks, capsys):
    # it hung with no warning; a partial cell without a collective says nothing
    ranks.run("z = 1", ranks=[0])
    assert "warning" not in capsys.readouterr().out
    ranks.run("import torch.distributed as dist\nif False:\n    dist.all_reduce(torch.ones(1))", ranks=[0])
    said = capsys.readouterr().out
    assert "runs on rank(s) 0 only, but calls dist.all_reduce: rank(s) 1 will not join" in said, said
