"""What a launch refuses for the machine's sake: a run folder another launch is using, more CPU ranks
than the machine holds. Both refused before a worker starts, with what to change in the message."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from conftest import assert_no_processes_left

from ddp_helpers import InvalidLaunchArguments, RunDirInUse, launch
from ddp_helpers.kernel.launcher import machine
from ddp_helpers.kernel.launcher.config import make_config
from ddp_helpers.kernel.launcher.runner import LOCK_NAME

# another process (a second kernel) launching tick.py into `run_dir`
OTHER_KERNEL = textwrap.dedent(
    """
    import sys
    from ddp_helpers import launch, LaunchInterrupted
    launch(sys.argv[1], nproc=2, run_dir=sys.argv[2], show_ranks="none")
    """
)


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_second_launch_into_a_run_dir_in_use_is_refused_not_mixed(script, tmp_path):
    tick, run_dir = script("tick.py"), tmp_path / "shared"
    other = subprocess.Popen([sys.executable, "-c", OTHER_KERNEL, str(tick), str(run_dir)])
    try:
        stdout = run_dir / "logs"
        # both ranks: under load the second rank's log can appear seconds after the first's
        _wait_for(
            lambda: len(list(stdout.rglob("stdout.log"))) == 2, 120, "the other kernel's 2 ranks to start"
        )
        started = time.monotonic()
        with pytest.raises(
            RunDirInUse, match=rf"run_dir {run_dir} is in use by another launch \(process {other.pid}"
        ):
            launch(tick, nproc=2, run_dir=run_dir, show_ranks="none")
        assert time.monotonic() - started < 5, "refused only after starting something"
        assert other.poll() is None, "the refused launch disturbed the running one"
        assert not (run_dir / "previous").exists(), "the refused launch moved the running one's files aside"
        logs = sorted(p.relative_to(run_dir) for p in run_dir.rglob("stdout.log"))
        assert len(logs) == 2, f"expected the running launch's 2 ranks' logs only, got {logs}"
    finally:
        other.kill()
        other.wait()
    assert_no_processes_left(str(tmp_path), wait_s=30)  # the other kernel's run goes with its process


def test_a_run_dir_is_free_again_once_its_launch_ends(script, tmp_path):
    run_dir = tmp_path / "again"
    for _ in range(2):  # one kernel, one after the other: the earlier outputs are kept aside
        assert launch(script("args.py"), nproc=1, run_dir=run_dir, show_ranks="none").returncode == 0
    assert (run_dir / LOCK_NAME).is_file() and (run_dir / "previous" / "1").is_dir()


def test_a_killed_launcher_leaves_no_stale_lock(tmp_path):
    # a kernel killed mid-run: the lock goes with its process, however it ended
    run_dir = tmp_path / "killed"
    holder = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from ddp_helpers.kernel.launcher.runner import holding_run_dir
        with holding_run_dir(Path({str(run_dir)!r})):
            print("held", flush=True)
            time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    from ddp_helpers.kernel.launcher.runner import holding_run_dir

    with pytest.raises(RunDirInUse):
        with holding_run_dir(run_dir):
            pass
    proc.kill()
    proc.wait()
    with holding_run_dir(run_dir):
        pass


def test_more_cpu_ranks_than_the_machine_holds_are_refused_at_once(script, tmp_path, monkeypatch):
    monkeypatch.delenv(machine.MAX_CPU_RANKS_ENV, raising=False)
    limit = machine.cpu_rank_limit()
    started = time.monotonic()
    with pytest.raises(
        InvalidLaunchArguments, match=rf"nproc={limit + 1} CPU ranks .* more than {limit} .*core"
    ):
        launch(script("args.py"), nproc=limit + 1, backend="gloo", run_dir=tmp_path / "run")
    assert time.monotonic() - started < 5
    assert not (tmp_path / "run").exists(), "a refused launch left a run folder"
    make_config(script("args.py"), nproc=limit, backend="gloo")  # the limit itself is allowed


def test_the_limit_allows_a_lesson_oversubscribed_and_follows_memory():
    assert machine.cpu_rank_limit(cores=2, memory=64 << 30) == 8  # notebooks run 8 ranks on 2 cores
    assert machine.cpu_rank_limit(cores=16, memory=64 << 30) == 64
    assert machine.cpu_rank_limit(cores=16, memory=machine.CPU_RANK_BYTES * 5) == 5
    assert machine.cpu_rank_limit(cores=1, memory=0) == 1


def test_an_explicit_override_allows_more_ranks(script, monkeypatch):
    monkeypatch.setenv(machine.MAX_CPU_RANKS_ENV, "100")
    assert make_config(script("args.py"), nproc=100, backend="gloo").nproc == 100
    with pytest.raises(InvalidLaunchArguments, match="DDP_HELPERS_MAX_CPU_RANKS=100"):
        make_config(script("args.py"), nproc=101, backend="gloo")
    monkeypatch.setenv(machine.MAX_CPU_RANKS_ENV, "many")
    with pytest.raises(InvalidLaunchArguments, match="whole number"):
        make_config(script("args.py"), nproc=2, backend="gloo")
