"""launch(): real torchrun subprocesses on gloo, with tiny scripts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pandas as pd
import psutil
import pytest
from conftest import assert_gone, assert_no_processes_left, descendants, processes_matching

import ddp_helpers
from ddp_helpers import (
    InvalidLaunchArguments,
    LaunchError,
    LaunchTimeout,
    WorkerFailed,
    launch,
)
from ddp_helpers.kernel.launcher import machine
from ddp_helpers.kernel.launcher.config import threads_per_rank
from ddp_helpers.rank.stack_dumps import WORKER_SITE
from ddp_helpers.workers import worker_path

LINE = re.compile(r"^rank (\d) line (\d+) x{300}$")


def test_streams_every_line_of_every_rank_prefixed_and_unmerged(script, tmp_path, capsys):
    result = launch(script("chatty.py"), 400, nproc=2, run_dir=tmp_path / "run")
    out = capsys.readouterr().out.splitlines()
    for rank in (0, 1):
        shown = [line for line in out if line.startswith(f"[rank {rank}] rank")]
        kept = [line for line in result.logs[rank] if line.startswith("rank")]
        # every line kept, in order, and none glued to another rank's line
        assert [int(m[2]) for k in kept if (m := LINE.match(k))] == list(range(400))
        assert all(LINE.match(line.removeprefix(f"[rank {rank}] ")) for line in shown[:400])
        assert len(shown) == 400
        assert f"rank {rank} stderr line" in result.logs[rank]


def test_result_object_holds_metrics_summary_and_timing(script, tmp_path, capsys):
    result = launch(script("chatty.py"), 100, nproc=2, run_dir=tmp_path / "run", progress="text")
    assert "2/2" in capsys.readouterr().err  # the text bar: total from plan.json, last step from rank 0
    assert result.returncode == 0
    assert result.wall_s > 0
    assert result.run_dir == (tmp_path / "run").resolve()
    assert isinstance(result.metrics, pd.DataFrame)
    assert sorted(result.metrics["rank"].unique()) == [0, 1]
    assert result.metrics.groupby("rank")["step"].max().tolist() == [2, 2]
    assert result.summary == {"lines": 100}
    assert "--standalone" in result.command
    # what the ranks got on top of this process's environment, which result.command does not show
    assert result.environment["OMP_NUM_THREADS"] == str(threads_per_rank(2))
    assert result.environment["PYTHONPATH"].split(os.pathsep)[0] == str(WORKER_SITE)
    assert "rank 0 line 0" in result.log(0)
    assert result.gpu_sampling.startswith("not requested") and result.lines_held_back == 0


def test_show_ranks_limits_the_echo_but_keeps_every_line(script, tmp_path, capsys):
    result = launch(script("chatty.py"), 50, nproc=2, run_dir=tmp_path / "run", show_ranks=0)
    out = capsys.readouterr().out
    assert "[rank 0] rank 0 line 49" in out
    assert "[rank 1]" not in out
    assert sum(line.startswith("rank 1 line") for line in result.logs[1]) == 50


def test_crash_on_rank_1_with_record_names_rank_and_exception(script, tmp_path):
    with pytest.raises(WorkerFailed) as info:
        launch(script("crash_record.py"), nproc=2, run_dir=tmp_path / "run")
    err = info.value
    assert str(err).splitlines()[0] == "rank 1 failed: ZeroDivisionError: division by zero"
    assert (err.rank, err.exitcode) == (1, 1)
    assert "return 1 / 0" in err.traceback
    assert isinstance(err, LaunchError)


def test_crash_without_record_still_names_rank_and_keeps_every_line(script, tmp_path):
    with pytest.raises(WorkerFailed) as info:
        launch(script("crash_plain.py"), nproc=2, run_dir=tmp_path / "run", show_ranks="none")
    err = info.value
    assert str(err).splitlines()[0] == "rank 1 failed: ValueError: bad shape: expected 3 channels, got 1"
    assert err.rank == 1
    assert 'raise ValueError("bad shape' in err.traceback
    assert [line for line in err.logs[1] if "chatter" in line] == [f"rank 1 chatter {i}" for i in range(300)]


def test_killed_rank_reports_the_signal(script, tmp_path):
    with pytest.raises(WorkerFailed) as info:
        launch(script("killed.py"), nproc=2, run_dir=tmp_path / "run")
    assert info.value.rank == 1
    assert info.value.exitcode == -signal.SIGKILL
    assert "SIGKILL" in str(info.value).splitlines()[0]
    assert "out-of-memory" in info.value.hint


@pytest.mark.skipif(machine.visible_gpus() > 0, reason="checks the CPU-only message")
def test_hard_coded_cuda_script_on_cpu_gets_a_hint(script, tmp_path):
    with pytest.raises(WorkerFailed) as info:
        launch(script("hardcoded_cuda.py"), nproc=2, run_dir=tmp_path / "run", backend="gloo")
    assert "no usable GPU" in info.value.hint
    assert "gloo" in str(info.value)


def test_hang_is_killed_after_the_timeout_and_names_silent_ranks(script, tmp_path):
    started = time.monotonic()
    hang = script("hang.py")
    with pytest.raises(LaunchTimeout) as info:
        # a short timeout once the ranks speak; start-up (importing torch on a busy machine) gets its own
        launch(hang, nproc=2, run_dir=tmp_path / "run", timeout=4, startup_timeout=120, grace_s=2)
    message = str(info.value)
    assert message.startswith("the run hung")
    assert info.value.silent_ranks == [0, 1]
    assert "rank 0: running" in message and "entering all_reduce" in message
    assert "slow here" not in message  # the ranks spoke: no advice about a slow start-up
    # where each rank waits, from its own stack: rank 0 in the collective, rank 1 in its loop. hang.py
    # imports nothing of this package: every rank the launcher starts registers (worker_site/)
    assert "dist.all_reduce(torch.ones(1))" in info.value.stacks[0]
    assert info.value.stacks[1].splitlines()[:2] == [
        f'File "{hang}", line 15 in <module>',
        "  time.sleep(1)",
    ]
    assert "TORCH_DISTRIBUTED_DEBUG" in message
    assert time.monotonic() - started < 60


def read_until(child: subprocess.Popen[str], marker: str, seen: list[str]) -> None:
    assert child.stdout is not None
    for line in child.stdout:
        seen.append(line)
        if marker in line:
            return


def test_interrupt_stops_every_process(script, tmp_path):
    tick = script("tick.py")
    # SIGINT raises KeyboardInterrupt even when pytest runs as a background job (which ignores SIGINT).
    # Like a kernel, the process lives on after the interrupted cell.
    code = textwrap.dedent(f"""
        import signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from ddp_helpers import launch
        try:
            launch({str(tick)!r}, nproc=2, run_dir={str(tmp_path / "run")!r}, progress="off", grace_s=2)
        except KeyboardInterrupt as interrupted:
            print(interrupted, flush=True)
        print("the kernel lives on", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert child.stdout is not None
    try:
        seen: list[str] = []
        read_until(child, "[rank 1] rank 1 tick 1", seen)
        # the workers, torchrun's agent and the agent server it was forked from
        started = descendants(child.pid)
        assert any("agent_server" in " ".join(p.cmdline()) for p in started), started
        child.send_signal(signal.SIGINT)
        read_until(child, "the kernel lives on", seen)
        assert "every process of the run was stopped" in "".join(seen)
        assert_gone(started, wait_s=1)  # the agent server too: an interrupted cell leaves no process
        left = [
            p.pid for p in processes_matching(str(tick)) if p.pid != child.pid
        ]  # the "kernel" has tick's path
        assert not left, left
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_a_second_interrupt_ends_as_cleanly_only_faster(script, tmp_path):
    # ranks that ignore SIGTERM hold the first stop for its 30 s grace period; a second Ctrl-C skips it
    stubborn = script("stubborn.py")
    code = textwrap.dedent(f"""
        import signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from ddp_helpers import launch
        try:
            launch({str(stubborn)!r}, nproc=2, run_dir={str(tmp_path / "run")!r}, progress="off", grace_s=30)
        except BaseException as interrupted:
            print(f"caught {{type(interrupted).__name__}}: {{interrupted}}", flush=True)
        print("the kernel lives on", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert child.stdout is not None
    try:
        seen: list[str] = []
        read_until(child, "[rank 1] rank 1 tick 1", seen)
        started = descendants(child.pid)
        child.send_signal(signal.SIGINT)
        time.sleep(1.0)  # inside the grace period: the ranks ignored SIGTERM
        interrupted_again = time.monotonic()
        child.send_signal(signal.SIGINT)
        read_until(child, "the kernel lives on", seen)
        took = time.monotonic() - interrupted_again
        text = "".join(seen)
        assert "caught LaunchInterrupted: interrupted: every process of the run was stopped" in text, text
        assert "at once: you interrupted again" in text, text
        assert "Traceback" not in text, text
        assert took < 15, f"the second interrupt still waited {took:.0f} s of the 30 s grace period"
        assert_gone(started, wait_s=5)  # the agent server too, reaped: no zombie of the kernel
        assert not [c for c in psutil.Process(child.pid).children() if c.status() == psutil.STATUS_ZOMBIE]
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nproc": 0}, "nproc must be >= 1"),
        ({"nproc": 1.5}, "nproc must be an integer"),
        ({"backend": "mpi2"}, "backend must be one of"),
        ({"timeout": -1}, "timeout must be a positive"),
        ({"show_ranks": "some"}, "show_ranks"),
        ({"progress": "loud"}, "progress must be one of"),
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
        ({"nnodes": 2}, "rdzv_endpoint"),
        ({"env": {"A": 1}}, "env keys and values must be strings"),
        ({"show_ranks": [5]}, r"show_ranks \[5\] is outside this world of 2"),
        ({"timeout": float("nan")}, "timeout must be a positive"),
        ({"grace_s": float("nan")}, "grace_s must be >= 0"),
        ({"nnodes": 2, "rdzv_endpoint": "h:1", "rdzv_timeout": True}, "rdzv_timeout must be"),
        ({"startup_timeout": 0}, "startup_timeout must be"),
        ({"nprocs": 2}, r"unknown option\(s\) \['nprocs'\]"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(script, tmp_path, kwargs, message):
    run_dir = tmp_path / "never"
    with pytest.raises(InvalidLaunchArguments, match=message):
        launch(script("chatty.py"), run_dir=run_dir, **kwargs)
    assert not run_dir.exists()


def test_missing_script_and_bad_script_args_are_refused(tmp_path):
    with pytest.raises(InvalidLaunchArguments, match="script not found"):
        launch(tmp_path / "nope.py")
    with pytest.raises(InvalidLaunchArguments, match="is a directory: pass the Python file"):
        launch(tmp_path)
    (tmp_path / "s.py").write_text("print(1)\n")
    with pytest.raises(InvalidLaunchArguments, match="pass strings, numbers or paths"):
        launch(tmp_path / "s.py", ["--steps", 3])  # type: ignore[arg-type]  # deliberately: a list is refused
    with pytest.raises(InvalidLaunchArguments, match="pass strings, numbers or paths"):
        launch(tmp_path / "s.py", True)


def test_a_run_dir_under_a_file_is_refused(script, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidLaunchArguments, match="is a file"):
        launch(script("chatty.py"), run_dir=tmp_path / "file" / "run")


def test_errors_render_without_the_launcher_stack():
    err = WorkerFailed(1, 1, "ZeroDivisionError: division by zero", "Traceback ...")
    assert err._render_traceback_()[0] == "WorkerFailed: rank 1 failed: ZeroDivisionError: division by zero"
    # caught by code that stops on an interrupt, and by code that catches the launcher's errors
    assert issubclass(ddp_helpers.LaunchInterrupted, KeyboardInterrupt)
    assert issubclass(ddp_helpers.LaunchInterrupted, LaunchError)


def test_a_rank_that_only_lost_its_peer_is_not_blamed(tmp_path):
    # rank 1 raises; rank 0 then fails inside all_reduce with "Connection reset by peer"
    with pytest.raises(WorkerFailed) as info:
        launch(
            worker_path("pitfalls"), "--case", "crash", nproc=2, run_dir=tmp_path / "run", show_ranks="none"
        )
    assert info.value.rank == 1
    assert str(info.value).splitlines()[0].startswith("rank 1 failed: ZeroDivisionError")


def test_a_cxx_abort_reports_the_signal_and_its_reason(tmp_path):
    # mismatched all_reduce sizes: gloo aborts the process with a C++ exception, no Python traceback
    with pytest.raises(WorkerFailed) as info:
        launch(
            worker_path("pitfalls"),
            "--case",
            "mismatch",
            nproc=2,
            run_dir=tmp_path / "run",
            show_ranks="none",
        )
    first = str(info.value).splitlines()[0]
    # the reason is gloo's own words: "collective mismatch" on torch 2.14, an enforce on the
    # message length ("op.preamble.length <= op.nbytes") on torch 2.7
    assert re.search(r"killed by signal SIGABRT: .*(mismatch|nbytes)", first), first


# ---------------------------------------------------------------------------- found as a new user would


def test_a_reused_run_dir_reports_only_this_launch(script, tmp_path):
    run_dir = tmp_path / "same"
    with pytest.raises(WorkerFailed, match="rank 1 failed: ValueError"):
        launch(script("crash_plain.py"), nproc=2, run_dir=run_dir, show_ranks="none")
    with pytest.raises(WorkerFailed) as info:
        launch(script("exit_message.py"), nproc=2, run_dir=run_dir, show_ranks="none")
    # both ranks exit with code 1 at once: torchrun's first observed failure may be either
    first = str(info.value).splitlines()[0]
    assert first in {f"rank {r} failed: exited with code 1: bad config: missing X" for r in (0, 1)}, first
    assert "crash_plain" not in str(info.value)
    assert not any("chatter" in line for line in info.value.logs[1])  # no line of the earlier run
    assert (run_dir / "previous" / "1" / "logs").is_dir()  # the earlier run's files are kept aside
    result = launch(script("chatty.py"), 10, nproc=2, run_dir=run_dir, show_ranks="none")
    assert result.summary == {"lines": 10} and "bad config" not in result.log(0)


def test_a_progress_bar_without_newlines_is_progress_and_shown_live(script, tmp_path, capsys):
    # 10 redraws 0.5 s apart and no newline until the end, under a 3 s no-progress timeout
    result = launch(
        script("partial_lines.py"), 10, nproc=1, run_dir=tmp_path / "run", timeout=3, startup_timeout=120
    )
    assert result.logs[0] == ["done"]  # a line's visible text: what follows its last \r
    assert re.search(r"^\[rank 0\] step \d$", capsys.readouterr().out, re.MULTILINE)


def test_no_helper_process_outlives_the_run(script, tmp_path):
    # each rank leaves a SIGTERM-proof helper in its own session, and a double-forked one, then exits 0
    result = launch(script("orphan.py"), str(tmp_path), nproc=2, run_dir=tmp_path / "run", grace_s=1)
    assert result.returncode == 0
    assert_no_processes_left(str(tmp_path), wait_s=1)


def test_script_arguments_never_reach_torchrun(script, tmp_path, capsys):
    launch(script("args.py"), "--max", 3, "--nproc-per-node", "x", nproc=1, run_dir=tmp_path / "run")
    assert "[rank 0] args: ['--max', '3', '--nproc-per-node', 'x']" in capsys.readouterr().out


def test_a_flood_is_shown_bounded_and_kept_whole(script, tmp_path, capsys):
    result = launch(script("chatty.py"), 3000, nproc=2, run_dir=tmp_path / "run")
    out = capsys.readouterr().out
    shown = sum(line.startswith("[rank") for line in out.splitlines())
    assert result.lines_held_back > 0 and shown < 6000
    assert f"every line is kept in result.logs and under {tmp_path / 'run' / 'logs'}" in out
    for rank in (0, 1):
        assert sum(line.startswith(f"rank {rank} line") for line in result.logs[rank]) == 3000


@pytest.mark.heavy  # its launches start in threads, where the fast tier cannot skip them
def test_two_launches_in_two_threads_never_share_a_line(script, tmp_path, capsys):
    chatty = script("chatty.py")
    threads = [
        threading.Thread(target=launch, args=(chatty, 200), kwargs={"nproc": 2, "run_dir": tmp_path / n})
        for n in ("a", "b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rank")]
    assert len(lines) >= 800
    assert all(line.count("[rank") == 1 for line in lines)
    assert all(LINE.match(line.split("] ", 1)[1]) for line in lines if " line " in line)


def test_uneven_inputs_name_the_rank_that_left_early(script, tmp_path):
    # rank 1 runs 5 all-reduces and exits 0; rank 0 wants 8 and loses its peer: rank 1 is the cause
    with pytest.raises(WorkerFailed) as info:
        ddp_helpers.launch(
            script("uneven.py"), nproc=2, run_dir=tmp_path / "run", timeout=60, show_ranks="none"
        )
    message = str(info.value)
    assert info.value.rank == 0 and info.value.left_early == [1], message
    first = message.splitlines()[0]
    assert first.startswith("rank 0 failed because rank 1 exited with code 0, its last line "), first
    assert "'rank 1 done after 5 steps', while rank 0 still waited in a collective" in first, first
    assert "Join" in message and "rank 0's traceback" in message and "dist.all_reduce(grad)" in message


def test_every_rank_is_a_fresh_interpreter_with_its_own_seeds(script, tmp_path):
    # Forked ranks shared one string-hash seed and one torch seed: a collective issued in a set's order, or
    # a model left unseeded, looked fine here and failed on real ranks. Each rank draws its own now.
    hidden = tmp_path / "site"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import os\nos.environ['HIDDEN_SITECUSTOMIZE_RAN'] = '1'\n")
    result = launch(script("seeds.py"), nproc=2, run_dir=tmp_path / "run", env={"PYTHONPATH": str(hidden)})
    seen = {}
    for rank in (0, 1):
        line = next(line for line in result.logs[rank] if "SEEN " in line)
        seen[rank] = json.loads(line.split("SEEN ", 1)[1])
    assert seen[0]["hash"] != seen[1]["hash"], seen
    assert seen[0]["set_order"] != seen[1]["set_order"], seen  # 32 names: equal by chance ~never
    assert seen[0]["initial_seed"] != seen[1]["initial_seed"], seen
    # the rank registered for stack dumps and took the variable away from its children; the user's
    # own sitecustomize, which the launcher's hides on the path, still ran
    assert seen[0]["child_registers"] == seen[1]["child_registers"] == "None", seen
    assert seen[0]["hidden_sitecustomize"] == seen[1]["hidden_sitecustomize"] == "1", seen
    stacks = sorted((tmp_path / "run" / "logs" / "stacks").glob("*.txt"))
    assert len(stacks) == 2, stacks  # the two ranks, not the agent, not the ranks' children
