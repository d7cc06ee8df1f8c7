"""The notebook helpers: write_worker and the %%torchrun cell magic, in a real IPython shell."""

from __future__ import annotations

import re

import pytest
from IPython.testing import globalipapp

from ddp_helpers import LaunchResult, WorkerFailed, write_worker
from ddp_helpers.workers import worker_path


@pytest.fixture(scope="module")
def ipython():
    shell = globalipapp.get_ipython()  # the one test shell of this process, started on first use
    shell.run_line_magic("load_ext", "ddp_helpers")
    return shell


def test_write_worker_copies_the_bundled_file(tmp_path):
    path = write_worker("train", tmp_path, show=False)
    assert path == (tmp_path / "train.py").resolve()
    assert path.read_text() == worker_path("train").read_text()
    assert "init_process_group" in path.read_text()


def test_write_worker_from_source_and_refuses_unknown_names(tmp_path):
    path = write_worker("mine", tmp_path, source="print('hi')", show=False)
    assert path.name == "mine.py" and path.read_text() == "print('hi')\n"
    with pytest.raises(
        FileNotFoundError, match=r"no bundled worker .nope.; available: allreduce_bench, .*train"
    ):
        write_worker("nope", tmp_path, show=False)


def test_torchrun_magic_runs_the_cell_on_every_rank(ipython, tmp_path, capsys):
    cell = "import os\nprint('hello from', os.environ['RANK'])\n"
    result = ipython.run_cell_magic("torchrun", f"--nproc 2 --run-dir {tmp_path}", cell)
    assert isinstance(result, LaunchResult)
    assert (tmp_path / "cell.py").read_text() == "\n" + cell  # the magic's line kept, empty
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out


def test_torchrun_magic_reports_the_exception_of_a_plain_ddp_cell(ipython, tmp_path):
    # the most common shape of a DDP script, without @record: torch prefixes its traceback "[rank1]: "
    cell = 'import torch.distributed as dist\ndist.init_process_group("gloo")\nif dist.get_rank() == 1:\n    1 / 0\n'
    with pytest.raises(WorkerFailed) as info:
        ipython.run_cell_magic("torchrun", f"--nproc 2 --run-dir '{tmp_path}' --show-ranks none", cell)
    assert str(info.value).splitlines()[0] == "rank 1 failed: ZeroDivisionError: division by zero"
    assert info.value.traceback.splitlines()[-3:] == [
        "    1 / 0",
        "    ~~^~~",
        "ZeroDivisionError: division by zero",
    ]
    # line 5 as the editor numbers it, the %%torchrun line being line 1
    assert re.search(r'File ".*cell\.py", line 5, in <module>', info.value.traceback), info.value.traceback


def test_torchrun_magic_refuses_a_syntax_error_before_starting_a_rank(ipython, tmp_path):
    from ddp_helpers.kernel.launcher.cell_source import CellSyntaxError

    cell = "import os\nprint(os.getpid()\n"
    with pytest.raises(CellSyntaxError) as info:
        ipython.run_cell_magic("torchrun", f"--nproc 2 --run-dir '{tmp_path}'", cell)
    assert info.value.error.lineno == 3, info.value.error  # the editor's line: %%torchrun is line 1
    assert not (tmp_path / "logs").exists(), "ranks were started for a cell that cannot compile"
    assert "ddp_helpers" not in "\n".join(info.value._render_traceback_())
