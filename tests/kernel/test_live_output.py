"""Live ranks: a cell's output lands in that cell, once, bounded in lines and in bytes."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fixtures import module_live_ranks
from IPython.testing import globalipapp

from ddp_helpers.kernel.launcher.cell_output import CellSyntaxError
from ddp_helpers.kernel.live import live_magics as live_magics

# Its module-scoped fixture starts a job: with `--dist loadgroup` one xdist worker runs the whole
# module, so the job starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_live_output")


ranks = module_live_ranks(nproc=1)


def test_a_flood_ends_in_its_own_cell_with_its_last_line_and_count(ranks, capsys):
    ranks.run("for i in range(10_000):\n    print('flood', i)\nprint('LAST LINE', rank)")
    out = capsys.readouterr().out
    last = [line for line in out.splitlines() if "LAST LINE 0" in line]
    assert last and "lines held back)" in last[0], out[-2000:]
    note = out.splitlines()[-1]
    assert "stdout.log" in note and str(ranks.run_dir) in note and "result.logs" not in note, note
    ranks.run("1")
    assert "LAST LINE" not in capsys.readouterr().out  # nothing of it reaches a later cell


def test_a_threads_late_line_is_labelled_with_the_cell_it_came_after(ranks, capsys):
    ranks.run("import threading\nthreading.Timer(0.5, lambda: print('late line', flush=True)).start()")
    time.sleep(2.0)
    capsys.readouterr()
    ranks.run("2")
    out = capsys.readouterr().out
    late = [line for line in out.splitlines() if "late line" in line]
    assert late and late[0].startswith("[rank 0 (after cell "), out


def test_a_line_without_a_newline_is_shown_once(ranks, capsys):
    ranks.run("import time\nprint('no newline here', end='', flush=True)\ntime.sleep(1.5)")
    assert capsys.readouterr().out.count("no newline here") == 1


def test_the_echo_bounds_bytes_and_keeps_the_whole_line_in_the_log(ranks, capsys):
    ranks.run("print('y' * 3_000_000)")
    out = capsys.readouterr().out
    assert len(out) < 10_000 and "3,000,000 characters" in out
    logs = list(ranks.run_dir.glob("logs/*/attempt_0/0/stdout.log"))
    assert logs and "y" * 3_000_000 in logs[0].read_text()
    value = ranks.run("list(range(10**6))")
    assert len(repr(value)) < 20_000 and "ranks.gather" in repr(value)
    assert len(value[0]) == 10**6  # the value itself is whole


def test_the_magic_honours_a_semicolon_and_says_when_nothing_ran(ranks, capsys, monkeypatch):
    magics: Any = live_magics.RanksMagics(
        shell=globalipapp.get_ipython()
    )  # IPython's decorator hides the method's type
    monkeypatch.setattr(live_magics, "_current", ranks)
    magics.ranks("", "x = 41\nx + 1;")
    assert "Out" not in capsys.readouterr().out
    magics.ranks("", "x + 1")
    assert "[rank 0] Out: 42" in capsys.readouterr().out
    monkeypatch.setattr(live_magics, "_current", None)
    magics.ranks("stop")
    assert "no live ranks were running" in capsys.readouterr().out


def test_a_syntax_error_shows_its_line_and_none_of_our_frames(ranks, monkeypatch):
    with pytest.raises(SyntaxError) as caught:
        ranks.run("x = 1\nreturn x")
    assert caught.value.text == "return x\n" and caught.value.lineno == 2
    magics: Any = live_magics.RanksMagics(
        shell=globalipapp.get_ipython()
    )  # IPython's decorator hides the method's type
    monkeypatch.setattr(live_magics, "_current", ranks)
    with pytest.raises(CellSyntaxError) as shown:
        magics.ranks("", "await something()")
    assert shown.value.error.lineno == 2  # as the editor numbers it: the %%ranks line is line 1
    rendered = "\n".join(shown.value._render_traceback_())
    assert "await something()" in rendered and "SyntaxError" in rendered, rendered
    assert "ddp_helpers" not in rendered, rendered  # none of our frames
