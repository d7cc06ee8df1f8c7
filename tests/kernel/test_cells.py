"""write_worker: a bundled worker, or a cell's source, written to a file that torchrun can run."""

from __future__ import annotations

import pytest

from ddp_helpers import write_worker
from ddp_helpers.workers import worker_path


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
