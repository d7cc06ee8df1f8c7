"""Where a command's CPU goes: the CPU-seconds of every Python process it starts, by kind of process.

    python benchmarks/process_costs.py [--top 15] [--log FILE] -- COMMAND [ARGS...]

For example ``-- .venv/bin/python -m pytest -n 3 --dist loadgroup`` (all of make test's pytest) or
``-- .venv/bin/python benchmarks/notebook_times.py 04_checkpointing_and_resume``.

The time targets are CPU-bound on 2 cores, and nearly all of that CPU is processes importing torch: this
says which processes, so that work goes where the seconds are. Each Python process the command starts
(ranks, torchrun agents, agent servers, kernels, pytest's workers) imports a ``sitecustomize`` that this
tool puts on ``PYTHONPATH``. At exit (``os._exit`` too, as forked agents leave) it appends the process's
own user+system seconds, its pid and its parent's (which process started which), its argv, whether it
imported torch, and the test that started it (``PYTEST_CURRENT_TEST``) to a JSON-lines log. The launcher
puts its own worker sitecustomize first on the ranks' path; that one runs the next one on the path, this
one, which runs the next in turn. A process killed by a signal writes nothing: the report gives the
command's own total beside the logged sum. A measurement, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

LOG_ENV = "PROCESS_COSTS_LOG"

SITECUSTOMIZE = '''
"""Written by benchmarks/process_costs.py: log this process's CPU-seconds at exit, then run the
sitecustomize this one hides on the path, if any."""
import atexit, importlib, json, os, sys

_written = set()


def _write():
    log = os.environ.get("PROCESS_COSTS_LOG")
    if not log or os.getpid() in _written:
        return
    _written.add(os.getpid())
    times = os.times()
    row = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:4], "cpu_s": times.user + times.system,
           "torch": "torch" in sys.modules, "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
    try:
        with open(log, "a") as fh:  # one short line in append mode: lines of processes do not mix
            fh.write(json.dumps(row) + "\\n")
    except OSError:
        pass


def _exit(code, _real=os._exit):
    _write()
    _real(code)


atexit.register(_write)
os._exit = _exit
_here = os.path.dirname(os.path.abspath(__file__))
_this = sys.modules.pop(__name__)
_path = sys.path[:]
sys.path[:] = [p for p in _path if os.path.abspath(p or ".") != _here]
try:
    importlib.import_module(__name__)
except ModuleNotFoundError as missing:
    if missing.name != __name__:
        raise
    sys.modules[__name__] = _this
finally:
    sys.path[:] = _path
'''


def kind(row: dict) -> str:
    """What a process was, from its argv: a script's name, ``-m`` and a module, or ``-c``."""
    argv = row["argv"] or ["?"]
    first = Path(argv[0]).name
    if first == "ipykernel_launcher.py":
        return "notebook kernel"
    if first == "-c":
        return "python -c"
    if first == "-m" and len(argv) > 1:
        return f"-m {argv[1]}"
    return first


def summarize(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Processes and CPU-seconds by kind, the costliest first."""
    by_kind: dict[str, dict[str, float]] = defaultdict(lambda: {"processes": 0, "cpu_s": 0.0, "torch": 0})
    for row in rows:
        entry = by_kind[kind(row)]
        entry["processes"] += 1
        entry["cpu_s"] += row["cpu_s"]
        entry["torch"] += row["torch"]
    return dict(sorted(by_kind.items(), key=lambda item: -item[1]["cpu_s"]))


def by_test(rows: list[dict]) -> dict[str, float]:
    """CPU-seconds by the test (or notebook test) whose processes they were, the costliest first."""
    totals: dict[str, float] = defaultdict(float)
    for row in rows:
        test = row["test"].rsplit(" (", 1)[0]  # "path::name (call)": the phase does not matter here
        totals[test or "(no test)"] += row["cpu_s"]
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def report(rows: list[dict], command_cpu_s: float, top: int) -> str:
    logged = sum(row["cpu_s"] for row in rows)
    lines = [
        f"{len(rows)} Python processes logged {logged:.1f} CPU-seconds; the command and all it waited for "
        f"used {command_cpu_s:.1f} (the rest: processes that logged nothing, such as ones killed by a signal "
        "or programs not in Python).",
        "",
        "| process | count | CPU-s | CPU-s each | imported torch |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, entry in list(summarize(rows).items())[:top]:
        count = int(entry["processes"])
        lines.append(
            f"| {name} | {count} | {entry['cpu_s']:.1f} | {entry['cpu_s'] / count:.2f} | {int(entry['torch'])} |"
        )
    tests = by_test(rows)
    if set(tests) != {"(no test)"}:
        lines += ["", "| test | CPU-s |", "|---|---:|"]
        lines += [f"| {test} | {cpu:.1f} |" for test, cpu in list(tests.items())[:top]]
    return "\n".join(lines)


def outer_path() -> list[str]:
    """PYTHONPATH without an outer measurement's site folder: this tool measuring its own tests would
    otherwise log each process twice, once per sitecustomize, and run the one they hide twice."""
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [p for p in entries if not _is_ours(Path(p, "sitecustomize.py"))]


def _is_ours(path: Path) -> bool:
    try:
        return path.read_text() == SITECUSTOMIZE
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=15, help="rows of each table")
    parser.add_argument("--log", type=Path, help="keep the JSON-lines log here (default: a temporary file)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to measure")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    with tempfile.TemporaryDirectory(prefix="process-costs-") as site:
        Path(site, "sitecustomize.py").write_text(SITECUSTOMIZE)
        log = (args.log or Path(site, "processes.jsonl")).resolve()
        log.unlink(missing_ok=True)
        pythonpath = os.pathsep.join([site, *outer_path()])
        env = {**os.environ, "PYTHONPATH": pythonpath, LOG_ENV: str(log)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        status = subprocess.run(command, env=env).returncode
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    command_cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(report(rows, command_cpu_s, args.top))
    if status:
        print(f"the command exited {status}")
    return status


if __name__ == "__main__":
    sys.exit(main())
