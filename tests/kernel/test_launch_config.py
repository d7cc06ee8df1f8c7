"""LaunchConfig, the CLI's parsing, the echo and the follower: in-process, no torchrun."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ddp_helpers import InvalidLaunchArguments, LaunchError, LaunchInterrupted
from ddp_helpers.kernel.launcher import config as config_module
from ddp_helpers.kernel.launcher import machine
from ddp_helpers.kernel.launcher.cell_output import CellEcho
from ddp_helpers.kernel.launcher.config import LaunchConfig, make_config, threads_per_rank
from ddp_helpers.kernel.launcher.log_follow import FileFollower, RankLogTail


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "s.py"
    path.write_text("print(1)\n")
    return path


@pytest.fixture
def config_sees_gpus(monkeypatch) -> Callable[[int], None]:
    """``config_sees_gpus(n)``: the configs made after it see n GPUs on this machine (in place of asking torch)."""
    return lambda count: monkeypatch.setattr(config_module, "visible_gpus", lambda: count)


def test_defaults_pick_gloo_and_two_processes_without_gpus(worker, monkeypatch, config_sees_gpus):
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    config_sees_gpus(0)
    config = make_config(worker)
    assert (config.nproc, config.local_world_size, config.backend, config.device) == (None, 2, "gloo", "cpu")
    env = config.environment()
    assert env["DDP_BACKEND"] == "gloo" and env["PYTHONUNBUFFERED"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env
    config = make_config(
        worker, max_restarts=1
    )  # restarts get a fresh rendezvous store: no stale peer addresses
    assert config.environment()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    config_sees_gpus(4)
    config = make_config(worker)
    assert (config.local_world_size, config.backend, config.device) == (4, "nccl", "cuda")


def test_nccl_needs_one_gpu_per_process(worker, config_sees_gpus):
    config_sees_gpus(0)
    with pytest.raises(InvalidLaunchArguments, match="needs CUDA GPUs"):
        make_config(worker, backend="nccl")
    config_sees_gpus(1)
    with pytest.raises(InvalidLaunchArguments, match="only 1 GPU"):
        make_config(worker, backend="nccl", nproc=2)
    assert make_config(worker, backend="gloo", nproc=3).device == "cpu"  # N gloo ranks instead


@pytest.mark.parametrize(
    "visible, nproc, cores, threads", [(0, 2, 16, 8), (8, 8, 16, 2), (1, 1, 16, 16), (4, 3, 2, 1)]
)
def test_threads_are_the_cores_shared_out_on_every_backend(
    worker, monkeypatch, config_sees_gpus, visible, nproc, cores, threads
):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(machine, "cpu_cores", lambda: cores)
    monkeypatch.setattr(config_module, "cpu_cores", lambda: cores)  # what threads_per_rank shares out
    config_sees_gpus(visible)
    config = make_config(worker, nproc=nproc)
    assert config.environment()["OMP_NUM_THREADS"] == str(threads)
    assert threads_per_rank(nproc, cores) == threads


def test_multinode_waits_120s_by_default_and_keeps_script_args_from_torchrun(worker, config_sees_gpus):
    config_sees_gpus(0)
    config = make_config(worker, ["--max", 3], nnodes=2, node_rank=1, rdzv_endpoint="h:29500")
    assert config.rdzv_timeout == 120
    command = config.command()
    assert "join_timeout=120" in command
    assert command[-4:] == ["--", str(worker), "--max", "3"]
    assert make_config(worker, nnodes=2, rdzv_endpoint="h:1", rdzv_timeout=5).rdzv_timeout == 5


def test_every_option_has_one_default():
    # launch() takes its defaults from LaunchConfig, never restates them
    import inspect

    from ddp_helpers.kernel.launcher.runner import launch

    code = launch.__code__  # the function itself restates no option; its shown signature is built
    assert code.co_flags & inspect.CO_VARKEYWORDS and code.co_varnames[:3] == (
        "script",
        "script_args",
        "options",
    )
    assert LaunchConfig.__dataclass_fields__["grace_s"].default == 5.0


def test_launch_interrupted_is_both_an_interrupt_and_a_launch_error():
    with pytest.raises(KeyboardInterrupt):
        raise LaunchInterrupted("stopped")
    assert isinstance(LaunchInterrupted("x"), LaunchError)


def test_the_follower_holds_partial_lines_and_keeps_what_a_terminal_shows(tmp_path):
    path = tmp_path / "f.log"
    follower = FileFollower(path)
    assert follower.read().nbytes == 0  # not there yet
    path.write_bytes(b"one\ntw")
    read = follower.read()
    assert (read.lines, read.partial) == (["one"], None)  # "tw" came with a whole line: torn, it waits
    assert follower.read().partial == "tw"  # nothing more came: an unfinished line, shown once
    assert follower.read().partial is None
    with open(path, "ab") as fh:
        fh.write(b"o\r 10%\r 50%")
    read = follower.read()
    assert (read.lines, read.partial, read.nbytes) == ([], " 50%", 11)
    with open(path, "ab") as fh:
        fh.write(b"\r100%\r\nlast")
    assert follower.read().lines == ["100%"]
    assert follower.read(final=True).lines == ["last"]


def test_multinode_lines_wait_for_the_workers_own_rank(tmp_path):
    log = tmp_path / "logs" / "r_1" / "attempt_0" / "0" / "stdout.log"
    log.parent.mkdir(parents=True)
    log.write_text("hello\n")
    tail = RankLogTail(tmp_path / "logs", rank_offset=0, ranks_known_up_front=False)
    assert tail.read_chunks() == []  # node_rank 0 may well hold ranks 2.. under c10d: wait
    tail.learn_ranks({0: 2})
    assert [(chunk.rank, chunk.lines) for chunk in tail.read_chunks()] == [(2, ["hello"])]
    assert tail.rank_file(2, "stdout.log") == log


def test_a_ranks_printed_lines_come_before_the_traceback_read_with_them(tmp_path):
    attempt = tmp_path / "logs" / "r_1" / "attempt_0" / "1"
    attempt.mkdir(parents=True)
    (attempt / "stdout.log").write_text("line 0\nline 1\n")
    (attempt / "stderr.log").write_text("Traceback (most recent call last):\nValueError: boom\n")
    tail = RankLogTail(tmp_path / "logs")
    texts = [text for chunk in tail.read_chunks() for text in chunk.lines]
    assert texts == ["line 0", "line 1", "Traceback (most recent call last):", "ValueError: boom"]


def echo_on_a_fake_clock(burst: int) -> tuple[CellEcho, list[str], list[float]]:
    """A CellEcho at 10 lines/s whose clock is now[0], and the lines it wrote."""
    now = [0.0]
    shown: list[str] = []
    echo = CellEcho(
        "/runs/x/logs",
        write=lambda text, stderr: shown.append(text),
        lines_per_s=10,
        burst=burst,
        clock=lambda: now[0],
    )
    return echo, shown, now


def test_the_echo_is_bounded_and_says_what_it_held_back():
    echo, shown, now = echo_on_a_fake_clock(burst=5)
    for i in range(100):
        echo.lines("rank 0", [f"line {i}"])
    assert shown == [f"[rank 0] line {i}" for i in range(5)]
    now[0] = 10.0
    echo.tick()  # the latest line and the count, then a note on where every line is
    assert shown[5] == "[rank 0] line 99   (95 lines held back)"
    assert "under /runs/x/logs" in shown[6] and echo.held_back == 95
    echo.lines("rank 1", ["after the pause"])  # the bucket refilled
    assert shown[-1] == "[rank 1] after the pause"


def test_a_held_back_source_reports_its_real_last_line_even_after_the_bucket_refills():
    """A flood's last line comes after a pause: it must not jump ahead of the held lines' report."""
    echo, shown, now = echo_on_a_fake_clock(burst=2)
    echo.lines("rank 0", [f"flood {i}" for i in range(10)])
    now[0] = 1.0  # ten tokens back, but rank 0 still has lines held back
    echo.lines("rank 0", ["LAST LINE"])
    echo.live("rank 0", "a torn line")  # no live updates from a source that is being held back
    echo.lines("rank 1", ["other rank"])  # another source is not held
    assert shown == ["[rank 0] flood 0", "[rank 0] flood 1", "[rank 1] other rank"]
    echo.close()
    assert shown[3] == "[rank 0] LAST LINE   (9 lines held back)" and echo.held_back == 9
    echo.lines("rank 0", ["after the report"])  # the report ended the hold
    assert shown[-1] == "[rank 0] after the report"


@pytest.mark.skipif(machine.visible_gpus() > 0, reason="checks the machine without a GPU")
def test_gpu_sampling_says_not_sampled_without_nvml_or_a_driver():
    from ddp_helpers.kernel.launcher.resources import nvml_handles

    handles, state = nvml_handles()
    assert handles == [] and state.startswith("not sampled: ")


def test_launch_shows_every_option_with_the_configs_default():
    """launch() takes **options (one source of defaults), yet Shift-Tab and help() list them all."""
    import dataclasses
    import inspect

    from ddp_helpers.kernel.launcher.config import LaunchConfig
    from ddp_helpers.kernel.launcher.options import DEFAULT_HANG_TIMEOUT_S, OPTION_NAMES
    from ddp_helpers.kernel.launcher.runner import launch

    params = inspect.signature(launch).parameters
    assert list(params)[:2] == ["script", "script_args"]
    defaults = {f.name: f.default for f in dataclasses.fields(LaunchConfig) if f.name in OPTION_NAMES}
    assert set(params) - {"script", "script_args"} == set(OPTION_NAMES)
    assert (
        params["timeout"].default == defaults["timeout"] == DEFAULT_HANG_TIMEOUT_S
    )  # no silent hang by default
    assert params["grace_s"].default == defaults["grace_s"]
    assert params["backend"].kind is inspect.Parameter.KEYWORD_ONLY


BAD_OPTIONS = [
    "nproc=0",
    "nproc=2, show_ranks=[5]",
    "timeout=-1",
    "backend='mpi'",
    "launcher='x'",
    "max_restarts=-1",
    "nnodes=2",
    "env={'A': 1}",
]


@pytest.mark.parametrize("options", BAD_OPTIONS)
def test_bad_arguments_are_refused_before_torch_is_imported(options, tmp_path):
    """`import torch` costs seconds; a typo must not (the refusal's speed is measured in make bench)."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text("print('never runs')\n")
    code = (
        "import sys, ddp_helpers\n"
        f"try:\n    ddp_helpers.launch({str(script)!r}, {options})\n"
        "except ddp_helpers.InvalidLaunchArguments as err:\n    print('refused:', err)\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused:" in out.stdout, out.stdout + out.stderr
    assert "torch imported: False" in out.stdout, out.stdout


def test_a_notebook_is_refused_as_a_script(tmp_path):
    # it ran as Python: every rank failed on the notebook's JSON
    notebook = tmp_path / "lesson.ipynb"
    notebook.write_text('{"cells": [], "nbformat": 4, "nbformat_minor": 5, "metadata": {}}')
    with pytest.raises(InvalidLaunchArguments, match="is a notebook, not a script.*nbconvert --to script"):
        make_config(notebook, (), nproc=2)
