"""write_worker keeps a learner's edited copy instead of silently overwriting it."""

from __future__ import annotations

import warnings

import pytest

from ddp_helpers import write_worker
from ddp_helpers.workers import worker_path


def test_an_untouched_copy_is_refreshed_and_an_edited_one_is_kept(tmp_path):
    path = write_worker("ddp", tmp_path, show=False)
    packaged = worker_path("ddp").read_text()
    assert path.read_text() == packaged
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # written again, nothing was edited: nothing to warn about
        assert write_worker("ddp", tmp_path, show=False) == path

    edited = packaged.replace("sampler.set_epoch(epoch)", "pass  # set_epoch dropped")
    path.write_text(edited)
    with pytest.warns(UserWarning, match="keeping your version") as said:
        assert write_worker("ddp", tmp_path, show=False) == path
    assert path.read_text() == edited, "the learner's edit was overwritten"
    message = str(said[0].message)
    assert str(worker_path("ddp")) in message and "delete your copy" in message

    path.unlink()
    write_worker("ddp", tmp_path, show=False)
    assert path.read_text() == packaged


def test_a_copy_written_from_an_older_package_is_not_taken_for_an_edit(tmp_path):
    older = tmp_path / "older.py"
    older.write_text("print('version 1')\n")
    path = write_worker(older, tmp_path / "runs", show=False)
    older.write_text("print('version 2')\n")  # the package changed, the copy was never touched
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "keeping your version": the copy was not edited
        write_worker(older, tmp_path / "runs", show=False)
    assert path.read_text() == "print('version 2')\n"


def test_source_always_writes_what_the_cell_holds(tmp_path):
    path = write_worker("mine", tmp_path, source="print(1)", show=False)
    path.write_text("print('edited on disk')\n")
    write_worker("mine", tmp_path, source="print(2)", show=False)
    assert path.read_text() == "print(2)\n"
