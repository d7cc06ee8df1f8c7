"""benchmarks/process_costs.py logs every Python process a command starts, os._exit included, and keeps
the sitecustomize it hides on the path working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "process_costs.py"

# a parent that spins a little, then starts a child that leaves through os._exit, as a forked agent does
PARENT = (
    "import subprocess, sys, time\n"
    "end = time.process_time() + 0.3\n"
    "while time.process_time() < end: pass\n"
    "subprocess.run([sys.executable, '-c', 'import os; os._exit(0)'], check=True)\n"
)


def _measure(tmp_path: Path, *command: str, env: dict[str, str] | None = None):
    log = tmp_path / "processes.jsonl"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--log", str(log), "--", *command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, rows


def test_every_python_process_is_logged_with_its_own_cpu_even_one_that_leaves_by_os_exit(tmp_path):
    proc, rows = _measure(tmp_path, sys.executable, "-c", PARENT)
    assert proc.returncode == 0, proc.stderr
    assert len(rows) == 2, rows  # the parent and the child that left through os._exit
    parent, child = sorted(rows, key=lambda row: -row["cpu_s"])
    assert parent["cpu_s"] >= 0.3 > child["cpu_s"], rows  # each its own seconds, not its children's
    assert "| python -c | 2 |" in proc.stdout, proc.stdout
    assert "2 Python processes logged" in proc.stdout, proc.stdout


def test_the_sitecustomize_it_hides_still_runs_and_the_exit_code_is_passed_on(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    marker = tmp_path / "hidden-ran"
    # written by the measured command's process only (the tool itself runs it too, unmeasured)
    (hidden / "sitecustomize.py").write_text(
        f"import os\nif os.environ.get('PROCESS_COSTS_LOG'):\n    open({str(marker)!r}, 'a').write('x')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(hidden)}
    proc, rows = _measure(tmp_path, sys.executable, "-c", "raise SystemExit(3)", env=env)
    assert proc.returncode == 3 and "the command exited 3" in proc.stdout, proc.stdout
    assert marker.read_text() == "x", "the hidden sitecustomize should run once"
    assert len(rows) == 1


def test_no_command_is_refused(tmp_path):
    proc, rows = _measure(tmp_path)
    assert proc.returncode == 2 and "give the command to measure" in proc.stderr
    assert rows == []


def test_a_measurement_inside_a_measurement_logs_each_process_once(tmp_path):
    # make process-costs runs this file's tests under the tool: each process must reach the inner log once
    outer = tmp_path / "outer"
    outer.mkdir()
    inner_log = tmp_path / "inner.jsonl"
    inner = [sys.executable, str(BENCH), "--log", str(inner_log), "--", sys.executable, "-c", PARENT]
    proc, _ = _measure(outer, *inner)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in inner_log.read_text().splitlines()]
    assert len(rows) == 2, rows
