"""`diagnose` and its parsers on canned torchrun output and error files (torch 2.7 and current): no processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_helpers.errors import WorkerFailed
from ddp_helpers.kernel.launcher.diagnosis import (
    _fault_stack,
    _last_traceback,
    _when_no_python_ran,
    destroy_deadlock_note,
    diagnose,
    strip_rank_prefix,
)
from ddp_helpers.kernel.launcher.log_follow import RankLogTail

# torchrun's report, as torch 2.14 prints it: rank 1 raised, rank 0 was stopped with SIGTERM.
REPORT_CURRENT = """\
W1130 04:25:32.920000 10649 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 10684 closing signal SIGTERM
E1130 04:25:33.046000 10649 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 10685) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/tmp/crash.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_04:25:33
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 10684)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 10684
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_04:25:32
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 10685)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

# The same report from torch 2.7.1 (other line numbers in the agent's log; one failure only).
REPORT_27 = """\
W1130 03:10:01.100000 311 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 320 closing signal SIGTERM
E1130 03:10:01.300000 311 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: {local} (pid: 321) of binary: /opt/conda/bin/python
Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
crash.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-06-04_03:10:01
  host      : node
  rank      : {rank} (local_rank: {local})
  exitcode  : {exitcode} (pid: 321)
  error_file: {error_file}
  traceback : {traceback}
============================================================
"""

# What torch (>= 2.3, so 2.7 and 2.14 alike) writes for an uncaught exception after init_process_group.
PREFIXED_TRACEBACK = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/crash.py", line 4, in <module>
[rank1]:     1 / 0
[rank1]:     ~~^~~
[rank1]: ZeroDivisionError: division by zero
"""

VICTIM_STDERR = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/tmp/crash.py", line 5, in <module>
[rank0]:     dist.barrier()
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:23213
"""


def make_logs(root: Path, files: dict[tuple[int, str], str], attempt: int = 0) -> RankLogTail:
    """torchrun's --log-dir layout with the given (local rank, file name) -> text."""
    for (local_rank, name), text in files.items():
        path = root / "logs" / "run_abc" / f"attempt_{attempt}" / str(local_rank) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return RankLogTail(root / "logs")


def error_file(message: str, callstack: str) -> str:
    # what torchelastic's @record writes (ErrorHandler.record_exception), on 2.7 and now
    return json.dumps(
        {"message": {"message": message, "extraInfo": {"py_callstack": callstack, "timestamp": "1717470601"}}}
    )


def test_the_rank_prefix_is_stripped_and_the_whole_traceback_kept(tmp_path):
    tail = make_logs(tmp_path, {(1, "stderr.log"): PREFIXED_TRACEBACK, (0, "stderr.log"): ""})
    found = diagnose(REPORT_CURRENT, tail, nranks=2, cuda_available=False)
    assert found is not None, "no diagnosis"
    assert (found.rank, found.exitcode) == (1, 1)
    assert found.error == "ZeroDivisionError: division by zero"
    assert found.traceback == strip_rank_prefix(PREFIXED_TRACEBACK).rstrip("\n")
    assert found.traceback.splitlines()[1] == '  File "/tmp/crash.py", line 4, in <module>'
    message = str(WorkerFailed(found.rank, found.exitcode, found.error, found.traceback))
    assert message.splitlines()[0] == "rank 1 failed: ZeroDivisionError: division by zero"


@pytest.mark.parametrize("prefixed", [True, False])
def test_torch_27_report_with_an_error_file_from_record(tmp_path, prefixed):
    stack = 'Traceback (most recent call last):\n  File "/w/crash.py", line 9, in main\n    return 1 / 0\nZeroDivisionError: division by zero\n'
    stderr = PREFIXED_TRACEBACK if prefixed else strip_rank_prefix(PREFIXED_TRACEBACK)
    tail = make_logs(
        tmp_path,
        {
            (1, "error.json"): error_file("ZeroDivisionError: division by zero", stack),
            (1, "stderr.log"): stderr,
        },
    )
    report = REPORT_27.format(
        rank=1, local=1, exitcode=1, error_file=tail.rank_file(1, "error.json"), traceback="Traceback ..."
    )
    found = diagnose(report, tail, nranks=2, cuda_available=False)
    assert found is not None, "no diagnosis"
    assert (found.rank, found.error) == (1, "ZeroDivisionError: division by zero")
    assert "return 1 / 0" in found.traceback  # the error file's stack, not stderr's


@pytest.mark.parametrize("report", ["current", "2.7"])
def test_a_victim_blamed_by_torchrun_gives_way_to_the_real_failure(tmp_path, report):
    tail = make_logs(tmp_path, {(0, "stderr.log"): VICTIM_STDERR, (1, "stderr.log"): PREFIXED_TRACEBACK})
    # torchrun's "first observed failure" is rank 0, which only lost its peer
    agent = (
        REPORT_CURRENT.replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)", 1)
        if report == "current"
        else REPORT_27.format(rank=0, local=0, exitcode=1, error_file="<N/A>", traceback="To enable ...")
    )
    found = diagnose(agent, tail, nranks=2, cuda_available=False)
    assert found is not None, "no diagnosis"
    assert found.rank == 1
    assert found.error == "ZeroDivisionError: division by zero"


@pytest.mark.parametrize(
    "stderr, first_line",
    [
        ("bad config: missing X\n", "exited with code 1: bad config: missing X"),
        (
            "usage: train.py [-h] [--resume]\ntrain.py: error: --resume needs --checkpoint-dir\n",
            "exited with code 2: train.py: error: --resume needs --checkpoint-dir",
        ),
        (
            "2048 samples are too few for --batch-size 5000 on 2 ranks\n"
            "[W1130 04:00:00.000000 1 ProcessGroupGloo.cpp:1] Warning: destroy_process_group() was not called\n",
            "exited with code 1: 2048 samples are too few for --batch-size 5000 on 2 ranks",
        ),
        ("", "exited with code 1 and left no traceback"),
    ],
)
def test_without_a_traceback_the_rank_own_words_are_the_first_line(tmp_path, stderr, first_line):
    tail = make_logs(tmp_path, {(0, "stderr.log"): stderr})
    code = 2 if "usage" in stderr else 1
    report = REPORT_27.format(rank=0, local=0, exitcode=code, error_file="<N/A>", traceback="To enable ...")
    found = diagnose(report, tail, nranks=1, cuda_available=False)
    assert found is not None, "no diagnosis"
    assert found.error == first_line
    if stderr:
        assert found.stderr_tail.splitlines()[-1] in stderr
        assert "ProcessGroupGloo" not in found.stderr_tail  # torch's logging is not the reason
        rendered = str(WorkerFailed(0, code, found.error, found.traceback, stderr_tail=found.stderr_tail))
        assert "the last lines of rank 0's stderr:" in rendered


def test_a_segfault_reports_the_signal_and_faulthandler_stack(tmp_path):
    stderr = (
        "step 3\nFatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
        '  File "/tmp/seg.py", line 4 in crash\n  File "/tmp/seg.py", line 6 in <module>\n\n'
        "Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)\n"
    )
    tail = make_logs(tmp_path, {(0, "stderr.log"): stderr})
    report = REPORT_27.format(rank=0, local=0, exitcode=-11, error_file="<N/A>", traceback="Signal 11 ...")
    found = diagnose(report, tail, nranks=1, cuda_available=False)
    assert found is not None, "no diagnosis"
    assert found.error == "killed by signal SIGSEGV"
    assert 'File "/tmp/seg.py", line 4 in crash' in found.traceback
    assert "Extension modules" not in found.traceback
    assert _fault_stack("no fault here") == ""


def test_an_abort_on_a_native_thread_at_exit_says_the_script_had_ended(tmp_path):
    # rank 1's stderr as it was when notebook 01's ddp.py job failed here (torch 2.14.1, gloo)
    stderr = (
        "terminate called without an active exception\nFatal Python error: Aborted\n\n"
        "Thread 0x00007febb61c1b80 (most recent call first):\n  <no Python frame>\n\n"
        "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)\n"
    )
    tail = make_logs(tmp_path, {(1, "stderr.log"): stderr})
    report = REPORT_27.format(rank=1, local=1, exitcode=-6, error_file="<N/A>", traceback="Signal 6 ...")
    found = diagnose(report, tail, nranks=2, cuda_available=False)
    assert found is not None, "no diagnosis"
    assert found.error.startswith("killed by signal SIGABRT: terminate called without an active exception, ")
    assert "after the script's last line" in found.error
    assert "<no Python frame>" in found.traceback
    # a fault inside the script's code is not blamed on the exit
    assert _when_no_python_ran('Current thread 0x1 (most recent call first):\n  File "a.py", line 2') == ""
    assert _when_no_python_ran('Thread 0x1 (most recent call first):\n  File "a.py", line 2') == ""
    assert _when_no_python_ran("") == ""
    # the dump itself crashed (seen too): it shows no thread, so nothing is claimed about them
    assert _when_no_python_ran("Fatal Python error: Segmentation fault\n\n") == ""


def test_last_traceback_takes_the_last_one_and_multi_line_messages():
    text = (
        "Traceback (most recent call last):\n  File 'a.py', line 1\nKeyError: 'old'\n"
        "some output\n"
        "[rank0]: Traceback (most recent call last):\n[rank0]:   File 'b.py', line 2, in f\n"
        "[rank0]: ValueError: two\n[rank0]: lines\n\n[rank0]:[W1130 torch warning]\n"
    )
    traceback, last = _last_traceback(strip_rank_prefix(text))  # as _rank_report passes it
    assert last == "ValueError: two"
    assert traceback.endswith("ValueError: two\nlines")
    assert "KeyError" not in traceback
    assert _last_traceback("no traceback\n") == ("", "")


def test_nothing_to_blame_returns_none(tmp_path):
    tail = make_logs(tmp_path, {(0, "stderr.log"): "", (1, "stderr.log"): ""})
    assert diagnose("RendezvousTimeoutError", tail, nranks=2, cuda_available=False) is None


# A rank stuck in the destroy, as the hang report shows it (the capstone's rank 1 on torch 2.7.1, in CI)
IN_DESTROY = """File "/repo/ddp_helpers/chapters/ch10_capstone/capstone.py", line 212 in main
  dist.destroy_process_group()
File "/repo/ddp_helpers/chapters/ch10_capstone/capstone.py", line 216 in <module>
  main()"""
IN_ALL_REDUCE = """File "/tmp/script.py", line 40 in train
  dist.all_reduce(t)
File "/tmp/script.py", line 60 in main
  dist.destroy_process_group()"""


def test_a_rank_stuck_in_the_destroy_on_torch_2_7_gloo_is_named_as_torchs_deadlock():
    note = destroy_deadlock_note({1: IN_DESTROY, 2: IN_ALL_REDUCE}, "gloo", "2.7.1+cpu")
    assert note.startswith("rank(s) 1 wait in destroy_process_group()"), note
    assert "pytorch/pytorch#154976" in note and "torch 2.7.1+cpu" in note, note


@pytest.mark.parametrize(
    ("stacks", "backend", "version"),
    [
        ({1: IN_DESTROY}, "gloo", "2.8.0"),  # fixed there: a hang in the destroy has another cause
        ({1: IN_DESTROY}, "nccl", "2.7.1"),
        ({1: IN_ALL_REDUCE}, "gloo", "2.7.1"),  # waits in a collective: the destroy is further out
        ({1: IN_DESTROY}, "gloo", "not-a-version"),
    ],
)
def test_no_deadlock_note_where_torchs_gloo_bug_cannot_be_the_cause(stacks, backend, version):
    assert destroy_deadlock_note(stacks, backend, version) == ""
