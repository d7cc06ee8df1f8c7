"""Forked workers (no GPU visible): each one is what ``python -u script.py`` would have been."""

from __future__ import annotations

import json
import textwrap

import pytest

from ddp_helpers import launch
from ddp_helpers.errors import WorkerFailed
from ddp_helpers.launcher import config as config_module
from ddp_helpers.launcher.config import make_config
from ddp_helpers.launcher.forked_worker import run_script
from ddp_helpers.launcher.worker_forks import PIDS_FILE, SWITCH_ENV, forked_ranks

# Prints what a fresh interpreter would have set up for the script, then leaves a non-daemon thread
# and an atexit function behind: Python's exit joins the one and runs the other.
REPORT = textwrap.dedent(
    """
    import atexit, json, os, sys, threading, time
    import numpy, torch
    def typed(x: int): pass
    report = {
        "annotation": repr(typed.__annotations__["x"]),
        "argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(),
        "threads": torch.get_num_threads(), "omp": os.environ["OMP_NUM_THREADS"],
        "rank": int(os.environ["RANK"]), "numpy_draw": float(numpy.random.random()),
        "session_leader": os.getsid(0) == os.getpid(),
    }
    print(json.dumps(report), flush=True)
    def late():
        time.sleep(0.3)
        print("the thread finished", flush=True)
    threading.Thread(target=late).start()
    atexit.register(lambda: print("atexit ran", flush=True))
    class Point:
        pass
    def pickle_at_exit():  # __main__ must still be the script's: pickle finds Point there
        import pickle
        pickle.dumps(Point())
        print("pickled at exit", flush=True)
    atexit.register(pickle_at_exit)
    log = open(os.path.join(os.environ["DDP_RUN_DIR"], f"unclosed-{report['rank']}.txt"), "w")
    log.write("the tail of a file never closed")  # written when Python frees it at exit
    if report["rank"] == 1 and sys.argv[1:] and sys.argv[1].startswith("stopped"):
        sys.exit(sys.argv[1])
    """
)


def _reports(result) -> list[dict]:
    return [json.loads(line) for lines in result.logs.values() for line in lines if line.startswith("{")]


def _count(result, text: str) -> int:
    return sum(line.count(text) for lines in result.logs.values() for line in lines)


@pytest.fixture
def report_script(tmp_path):
    path = tmp_path / "scripts" / "report.py"
    path.parent.mkdir()
    path.write_text(REPORT)
    return path


def test_a_forked_worker_starts_and_ends_as_python_would(report_script, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = launch(report_script, "--flag", nproc=2, run_dir=tmp_path / "run", progress="off")
    assert result.workers == "forked"
    listed = forked_ranks(tmp_path / "run" / "logs")
    assert sorted(entry["rank"] for entry in listed.values()) == [0, 1]  # both were forked
    reports = _reports(result)
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for report in reports:
        assert report["argv"] == [str(report_script), "--flag"]
        assert report["path0"] == str(report_script.parent)  # as `python script.py` sets it
        assert report["name"] == "__main__" and report["session_leader"]
        assert report["annotation"] == "<class 'int'>"  # no `from __future__` of the launcher's leaks in
        assert report["threads"] == 1 and report["omp"] == "1"  # read again after the fork
    assert reports[0]["numpy_draw"] != reports[1]["numpy_draw"]  # each its own random state
    assert _count(result, "the thread finished") == 2 and _count(result, "atexit ran") == 2
    assert _count(result, "pickled at exit") == 2
    for rank in (0, 1):
        assert (tmp_path / "run" / f"unclosed-{rank}.txt").read_text() == "the tail of a file never closed"


def test_a_forked_worker_exits_with_its_code_and_its_message(report_script, tmp_path):
    with pytest.raises(WorkerFailed) as failed:
        launch(report_script, "stopped: no data", nproc=2, run_dir=tmp_path / "run", progress="off")
    assert failed.value.rank == 1 and failed.value.exitcode == 1  # sys.exit("...") exits with 1
    assert "stopped: no data" in str(failed.value)


def test_an_uncaught_exception_shows_the_scripts_own_traceback(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("def step():\n    raise ValueError('bad batch')\n\nstep()\n")
    with pytest.raises(WorkerFailed) as failed:
        launch(script, nproc=1, run_dir=tmp_path / "run", progress="off")
    trace = failed.value.traceback
    assert trace.splitlines()[1].strip() == f'File "{script}", line 4, in <module>', trace
    assert "worker_forks" not in trace and "runpy" not in trace  # no frame of the fork itself
    assert "ValueError: bad batch" in trace


def test_a_syntax_error_or_a_missing_script_reads_as_python_says_it(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("print('never')\ndef (:\n")
    with pytest.raises(WorkerFailed) as failed:
        launch(script, nproc=1, run_dir=tmp_path / "run", progress="off")
    stderr = "\n".join(failed.value.logs[0])
    assert "SyntaxError" in stderr and f'File "{script}", line 2' in stderr and "runpy" not in stderr, stderr
    assert "never" not in stderr
    assert run_script(str(tmp_path / "gone.py")) == 2  # (launch refuses a missing script before it starts)
    assert "can't open file" in capsys.readouterr().err


def test_switched_off_or_with_gpus_the_workers_are_torchruns_own(report_script, tmp_path, monkeypatch):
    with monkeypatch.context() as machine:
        machine.setattr(config_module, "visible_gpus", lambda: 1)  # a machine with a GPU
        assert make_config(report_script, nproc=1, backend="gloo").environment()[SWITCH_ENV] == "0"
    monkeypatch.setenv(SWITCH_ENV, "off")
    result = launch(report_script, nproc=2, run_dir=tmp_path / "run", progress="off")
    assert not (tmp_path / "run" / "logs" / PIDS_FILE).exists() and result.workers == "fresh"
    assert sorted(r["rank"] for r in _reports(result)) == [0, 1]
