"""launch(): real torchrun subprocesses on gloo, with tiny scripts."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pandas as pd
import pytest
from conftest import assert_no_processes_left

import ddp_helpers
from ddp_helpers import (
    InvalidLaunchArguments,
    LaunchError,
    LaunchTimeout,
    WorkerFailed,
    launch,
    launch_config,
)
from ddp_helpers.workers import worker_path

LINE = re.compile(r"^rank (\d) line (\d+) x{300}$")


def test_streams_every_line_of_every_rank_prefixed_and_unmerged(script, tmp_path, capsys):
    result = launch(script("chatty.py"), 400, nproc=2, run_dir=tmp_path / "run")
    out = capsys.readouterr().out.splitlines()
    for rank in (0, 1):
        shown = [line for line in out if line.startswith(f"[rank {rank}] rank")]
        kept = [line for line in result.logs[rank] if line.startswith("rank")]
        # every line kept, in order, and none glued to another rank's line
        assert [int(LINE.match(k)[2]) for k in kept if LINE.match(k)] == list(range(400))
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
    assert "rank 0 line 0" in result.log(0)


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


@pytest.mark.skipif(launch_config.visible_gpus() > 0, reason="checks the CPU-only message")
def test_hard_coded_cuda_script_on_cpu_gets_a_hint(script, tmp_path):
    with pytest.raises(WorkerFailed) as info:
        launch(script("hardcoded_cuda.py"), nproc=2, run_dir=tmp_path / "run", backend="gloo")
    assert "no usable GPU" in info.value.hint
    assert "gloo" in str(info.value)


def test_hang_is_killed_after_the_timeout_and_names_silent_ranks(script, tmp_path):
    started = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(script("hang.py"), nproc=2, run_dir=tmp_path / "run", timeout=20, grace_s=2)
    message = str(info.value)
    assert message.startswith("the run hung")
    assert info.value.silent_ranks == [0, 1]
    assert "rank 0: running" in message and "entering all_reduce" in message
    assert "TORCH_DISTRIBUTED_DEBUG" in message
    assert time.monotonic() - started < 60


def test_interrupt_stops_every_process(script, tmp_path):
    tick = script("tick.py")
    code = textwrap.dedent(f"""
        from ddp_helpers import launch
        launch({str(tick)!r}, nproc=2, run_dir={str(tmp_path / "run")!r}, progress="off", grace_s=2)
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = []
    for line in child.stdout:
        seen.append(line)
        if "[rank 1] rank 1 tick 1" in line:
            break
    child.send_signal(signal.SIGINT)
    rest, _ = child.communicate(timeout=30)
    assert child.returncode != 0
    assert "every process of the run was stopped" in rest
    assert_no_processes_left(str(tick), wait_s=1)


def test_two_launches_at_once_do_not_clash(script, tmp_path):
    chatty = script("chatty.py")
    results, errors = {}, []

    def run(name):
        try:
            results[name] = launch(chatty, 50, nproc=2, run_dir=tmp_path / name, show_ranks="none")
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert {r.returncode for r in results.values()} == {0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nproc": 0}, "nproc must be >= 1"),
        ({"nproc": 1.5}, "nproc must be an integer"),
        ({"backend": "mpi2"}, "unknown backend"),
        ({"timeout": -1}, "timeout must be a positive"),
        ({"show_ranks": "some"}, "show_ranks"),
        ({"progress": "loud"}, "progress must be one of"),
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
        ({"nnodes": 2}, "rdzv_endpoint"),
        ({"env": {"A": 1}}, "env keys and values must be strings"),
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
    (tmp_path / "s.py").write_text("print(1)\n")
    with pytest.raises(InvalidLaunchArguments, match="pass strings, numbers or paths"):
        launch(tmp_path / "s.py", ["--steps", 3])
    with pytest.raises(InvalidLaunchArguments, match="pass strings, numbers or paths"):
        launch(tmp_path / "s.py", True)


def test_nccl_needs_one_gpu_per_process(tmp_path, monkeypatch):
    (tmp_path / "s.py").write_text("print(1)\n")
    monkeypatch.setattr(launch_config, "visible_gpus", lambda: 0)
    with pytest.raises(InvalidLaunchArguments, match="needs CUDA GPUs"):
        launch(tmp_path / "s.py", backend="nccl")
    monkeypatch.setattr(launch_config, "visible_gpus", lambda: 1)
    with pytest.raises(InvalidLaunchArguments, match="only 1 GPU"):
        launch(tmp_path / "s.py", backend="nccl", nproc=2)


def default_config(script):
    return launch_config.make_config(
        script, [], nproc=None, backend="auto", timeout=None, run_dir=None, env=None,
        max_restarts=0, show_ranks="all", grace_s=1, nnodes=1, node_rank=0, rdzv_endpoint=None,
    )  # fmt: skip


def test_defaults_pick_gloo_and_two_processes_without_gpus(tmp_path, monkeypatch):
    (tmp_path / "s.py").write_text("print(1)\n")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    monkeypatch.setattr(launch_config, "visible_gpus", lambda: 0)
    config = default_config(tmp_path / "s.py")
    assert (config.nproc, config.backend, config.device) == (2, "gloo", "cpu")
    env = config.environment()
    assert env["DDP_BACKEND"] == "gloo" and env["PYTHONUNBUFFERED"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env
    config.max_restarts = 1  # restarts get a fresh rendezvous store: no stale peer addresses
    assert config.environment()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    monkeypatch.setattr(launch_config, "visible_gpus", lambda: 4)
    config = default_config(tmp_path / "s.py")
    assert (config.nproc, config.backend, config.device) == (4, "nccl", "cuda")


def test_errors_render_without_the_launcher_stack():
    err = WorkerFailed(1, 1, "ZeroDivisionError: division by zero", "Traceback ...")
    assert err._render_traceback_()[0] == "WorkerFailed: rank 1 failed: ZeroDivisionError: division by zero"
    assert issubclass(ddp_helpers.LaunchInterrupted, KeyboardInterrupt)


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
