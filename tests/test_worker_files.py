"""write_worker keeps a learner's edited copy instead of silently overwriting it."""

from __future__ import annotations

from ddp_helpers import write_worker
from ddp_helpers.workers import worker_path


def test_an_untouched_copy_is_refreshed_and_an_edited_one_is_kept(tmp_path, capsys):
    path = write_worker("ddp", tmp_path, show=False)
    packaged = worker_path("ddp").read_text()
    assert path.read_text() == packaged
    assert write_worker("ddp", tmp_path, show=False) == path  # written again: nothing was edited
    assert capsys.readouterr().out == ""

    edited = packaged.replace("sampler.set_epoch(epoch)", "pass  # set_epoch dropped")
    path.write_text(edited)
    assert write_worker("ddp", tmp_path, show=False) == path
    assert path.read_text() == edited, "the learner's edit was overwritten"
    said = capsys.readouterr().out
    assert "keeping your version" in said and str(worker_path("ddp")) in said and "overwrite=True" in said

    write_worker("ddp", tmp_path, show=False, overwrite=True)
    assert path.read_text() == packaged


def test_a_copy_written_from_an_older_package_is_not_taken_for_an_edit(tmp_path, capsys):
    older = tmp_path / "older.py"
    older.write_text("print('version 1')\n")
    path = write_worker(older, tmp_path / "runs", show=False)
    older.write_text("print('version 2')\n")  # the package changed, the copy was never touched
    write_worker(older, tmp_path / "runs", show=False)
    assert path.read_text() == "print('version 2')\n"
    assert "keeping" not in capsys.readouterr().out


def test_source_always_writes_what_the_cell_holds(tmp_path):
    path = write_worker("mine", tmp_path, source="print(1)", show=False)
    path.write_text("print('edited on disk')\n")
    write_worker("mine", tmp_path, source="print(2)", show=False)
    assert path.read_text() == "print(2)\n"
