"""The notebook helpers: write_worker and the %%torchrun cell magic, in a real IPython shell."""

from __future__ import annotations

import pytest
from IPython.testing.globalipapp import start_ipython

from ddp_helpers import LaunchResult, WorkerFailed, write_worker
from ddp_helpers.workers import worker_path


@pytest.fixture(scope="module")
def ipython():
    shell = start_ipython()
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
    assert (tmp_path / "cell.py").read_text() == cell
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out


def test_torchrun_magic_raises_worker_failed(ipython, tmp_path):
    cell = "import os\nif os.environ['RANK'] == '1':\n    raise KeyError('missing')\n"
    with pytest.raises(WorkerFailed, match="rank 1 failed: KeyError: 'missing'"):
        ipython.run_cell_magic("torchrun", f"--nproc 2 --run-dir {tmp_path}", cell)
