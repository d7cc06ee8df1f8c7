"""The command line's own messages: the doctor's advice when its live check cannot run."""

from __future__ import annotations

from ddp_helpers.__main__ import main


def test_doctor_with_a_refused_nproc_points_at_the_argument_not_at_an_error_above(capsys):
    assert main(["doctor", "--nproc", "0"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "all_reduce (live)" in line)
    assert "FAIL" in row and "nproc" in row, out
    assert "see the error above" not in out and "show_ranks" not in out, out
    assert "nothing was started" in out, out
