"""The command line's own messages: usage, options, and the doctor's advice when its live check cannot run."""

from __future__ import annotations

import pytest
from conftest import SCRIPTS

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
