"""The command line's own messages: usage, options, and the doctor's advice when its live check cannot run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from conftest import SCRIPTS, assert_no_processes_left

from ddp_helpers.__main__ import main


def test_the_usage_error_asks_for_the_script_only(capsys):
    with pytest.raises(SystemExit):
        main(["launch"])
    err = capsys.readouterr().err
    assert "required: script" in err
    assert "script_args" not in err.splitlines()[-1]  # a script may take no arguments


def test_the_cli_has_the_startup_timeout_that_its_hang_report_suggests(capsys):
    # the hang report says "a longer startup_timeout may be all that is needed": the CLI must offer it
    assert main(["launch", "--startup-timeout", "-1", str(SCRIPTS / "tick.py")]) == 1
    err = capsys.readouterr().err
    assert "InvalidLaunchArguments" in err and "startup_timeout" in err


def test_doctor_with_a_refused_nproc_points_at_the_argument_not_at_an_error_above(capsys):
    assert main(["doctor", "--nproc", "0"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "all_reduce (live)" in line)
    assert "FAIL" in row and "nproc" in row, out
    assert "see the error above" not in out and "show_ranks" not in out, out
    assert "nothing was started" in out, out


def test_ctrl_c_twice_stops_the_run_at_once_with_one_line_not_a_traceback(tmp_path):
    # the ranks ignore SIGTERM, so the first Ctrl-C waits out the grace period; the second skips it
    script = tmp_path / "stubborn.py"
    script.write_text((SCRIPTS / "stubborn.py").read_text())
    command = [sys.executable, "-m", "ddp_helpers", "launch", "--nproc", "2", "--grace-s", "30"]
    child = subprocess.Popen(
        [*command, "--run-dir", str(tmp_path / "run"), str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        for line in child.stdout:
            if "rank 1 tick 1" in line:
                break
        child.send_signal(signal.SIGINT)
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
    finally:
        child.kill()
    assert child.returncode == 128 + signal.SIGINT, (child.returncode, err)
    assert "Traceback" not in err, err
    assert err.strip().startswith(
        "LaunchInterrupted: SIGINT: interrupted: every process of the run was stopped"
    )
    assert "you interrupted again" in err and str(tmp_path / "run") in err, err
    assert_no_processes_left(str(script), wait_s=5)
