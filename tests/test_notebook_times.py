"""benchmarks/notebook_times.py counts the jobs a notebook started from the run folders they leave."""

from __future__ import annotations

from pathlib import Path

from fixtures import load_script

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "notebook_times.py"


def load_bench():
    return load_script("notebook_times", BENCH)


def test_jobs_are_counted_by_their_logs_folders_killed_early_or_one_process(tmp_path):
    bench = load_bench()
    torchrun = tmp_path / "runs" / "a" / "logs"
    (torchrun / "run-id" / "attempt_0" / "0").mkdir(parents=True)
    (torchrun / "run-id" / "attempt_1" / "0").mkdir(parents=True)  # a restart: still one job
    (torchrun / "torchrun.log").write_text("")
    killed = tmp_path / "runs" / "b" / "logs"  # stopped before any worker started
    killed.mkdir(parents=True)
    (killed / "torchrun.log").write_text("")
    (tmp_path / "deep" / "ckpt" / "one-process" / "logs" / "python" / "attempt_0").mkdir(parents=True)
    (tmp_path / "runs" / "c" / "logs").mkdir(parents=True)  # a logs folder no launch wrote: not a job
    assert bench.jobs_started(tmp_path) == 3


def test_a_failed_notebooks_folder_is_kept_without_its_weights(tmp_path, monkeypatch):
    bench = load_bench()
    monkeypatch.setattr(bench, "REPO", tmp_path / "repo")
    out_dir = tmp_path / "out"  # the temporary folder the notebooks ran in
    logs = out_dir / "runs" / "job" / "logs" / "run-id" / "attempt_0" / "1"
    logs.mkdir(parents=True)
    (logs / "error.json").write_text('{"message": "rank 1 failed"}')
    (out_dir / "01_first.ipynb").write_text("{}")
    (out_dir / "runs" / "ddp.pt").write_bytes(b"weights")
    kept = bench.keep_failure("01_first", out_dir)
    assert kept == tmp_path / "repo" / "runs" / "notebook-times-failed" / "01_first"
    assert (kept / "runs" / "job" / "logs" / "run-id" / "attempt_0" / "1" / "error.json").read_text() == (
        '{"message": "rank 1 failed"}'
    )
    assert (kept / "01_first.ipynb").is_file() and not (kept / "runs" / "ddp.pt").exists()


def test_notebooks_are_found_by_path_or_by_the_start_of_their_name(tmp_path, capsys):
    bench = load_bench()
    first = bench.NOTEBOOKS[1]
    assert bench.find_notebook(first.stem[:2]) == first
    assert bench.find_notebook(first.stem) == first
    assert bench.find_notebook(str(first)) == first
    elsewhere = tmp_path / "mine.ipynb"
    elsewhere.write_text("{}")
    assert bench.find_notebook(str(elsewhere)) == elsewhere
    for unknown in ("99", "0"):  # none, and more than one: refused before anything runs
        try:
            bench.main([unknown])
        except SystemExit as exit:
            assert exit.code == 2
        else:
            raise AssertionError(f"{unknown!r} was accepted")
        assert f"{unknown!r} names" in capsys.readouterr().err
