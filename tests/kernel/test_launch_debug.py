"""breakpoint() in a script that launch() runs: the error says why pdb quit, and where to look instead."""

from __future__ import annotations

import pytest

from ddp_helpers import WorkerFailed, launch
from ddp_helpers.kernel.launcher.diagnosis import NO_STDIN_HINT

STOPS = "x = 1\nbreakpoint()\nprint('after the breakpoint', x)\n"


def test_breakpoint_under_launch_names_the_missing_terminal_and_the_live_ranks(tmp_path):
    script = tmp_path / "stops.py"
    script.write_text(STOPS)
    with pytest.raises(WorkerFailed) as caught:
        launch(script, nproc=1, run_dir=tmp_path / "run")
    message = str(caught.value)
    assert "BdbQuit" in message, message
    assert f"hint: {NO_STDIN_HINT}" in message, message
    assert "no terminal" in message and "ranks.where()" in message, message
