"""The path one `launch()` takes through the package, as a reader following the code walks it.

    python benchmarks/launch_path.py [--nproc 2] [--launches 2]

Runs `trivial_job.py` (init, one all_reduce, tear down) on gloo and prints, for each launch, the package
files a reader passes through, in order, and how often each file is visited. tests/kernel/test_launch_path.py
holds the launcher to at most two visits per file.

The rule: what someone reading one launch, from the call of `launch` to its result, has to open.
- Calls are recorded, not guessed: every call of a function of ``ddp_helpers`` on the thread that called
  `launch` (and on any thread started during it: ``threading.setprofile``). The caller is the nearest
  package frame up the stack, so ``with _stopped_at_exit(...)`` through contextlib is runner.py calling
  runner.py. Calls into the standard library, torch, pandas, ... are not followed, nor is code run
  while a module is imported.
- The reader then reads the way one reads code: from `launch` down, each function top to bottom, its
  calls in the order of the lines they are on (a loop's body once), going into each function called
  that was not read yet and coming back to the line they left. A function is read once, whatever the
  number of calls: a poll loop's later rounds add nothing to read.
- A *stop* is going into a function of another package file. Reading on in the same file is not a stop.
- Properties are read in place: ``config.log_dir`` reads as a value where it is used (an accessor of
  the object in hand). What a property calls is read as if its user called it.
- A *visit* to a file starts at a stop into it, unless the file is still open. The reader keeps one
  file open at each depth of their reading (depth: how many stops in from `launch`): a stop into the
  file open at its depth is reading on there (``read_metrics(...)``, then on the next line
  ``read_summary(...)``; a with statement's ``__init__``, ``__enter__`` and ``__exit__``; one line
  that calls each option's check in turn); a stop into another file closes the one open at that depth
  and every one deeper. Coming back to the caller is not a visit: the reader returns to the line they
  were reading. So a file visited three times is one the reader had to leave and open again, twice.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import pkgutil
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import ddp_helpers

JOB = Path(__file__).with_name("trivial_job.py")
PACKAGE = Path(ddp_helpers.__file__).resolve().parent


@dataclass
class Stop:
    file: str  # relative to the package, e.g. "kernel/launcher/config.py"
    function: str  # the qualified name of the function the stop goes into
    caller: str  # the qualified name of the function it comes from ("" for the call of launch itself)
    depth: int  # how many stops deep: a stop made while reading the previous one is one deeper
    new_visit: bool = True  # False: the file was still open (the rule in this module's docstring)


@dataclass
class LaunchPath:
    stops: list[Stop] = field(default_factory=list)

    def visits(self) -> Counter[str]:
        return Counter(stop.file for stop in self.stops if stop.new_visit)

    def revisits(self) -> int:
        """Visits to a file visited before: what the reader had to open again."""
        return sum(count - 1 for count in self.visits().values())

    def report(self) -> str:
        visits = self.visits()
        lines = [
            f"{len(self.stops)} stops, {sum(visits.values())} visits to {len(visits)} files, "
            f"{self.revisits()} of them to a file visited before"
        ]
        lines += [
            f"{'  ' * stop.depth}{stop.file}: {stop.function}" + ("" if stop.new_visit else "  (still open)")
            for stop in self.stops
        ]
        lines.append("visits per file:")
        lines += [f"  {count}  {file}" for file, count in visits.most_common()]
        return "\n".join(lines)


def package_file(code: CodeType) -> str | None:
    """`code`'s file relative to the package, or None outside it."""
    path = _resolved(code.co_filename)
    return path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else None


@functools.cache
def _resolved(filename: str) -> Path:
    return Path(filename).resolve() if not filename.startswith("<") else Path(filename)


def property_codes() -> set[CodeType]:
    """The code of every property getter of the package's imported modules: read in place."""
    codes: set[CodeType] = set()
    for module in [m for name, m in list(sys.modules.items()) if name.startswith("ddp_helpers")]:
        for cls in [v for v in vars(module).values() if isinstance(v, type)]:
            for value in vars(cls).values():
                getter = value.fget if isinstance(value, property) else getattr(value, "func", None)
                if getter is not None and hasattr(getter, "__code__"):
                    codes.add(getter.__code__)
    return codes


class CallRecorder:
    """The profile function: which package function called which, from which line, first seen first."""

    def __init__(self) -> None:
        self.calls: dict[CodeType | None, dict[CodeType, int]] = {}  # caller -> {callee: line}
        self.seen: set[tuple[CodeType | None, CodeType]] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or package_file(frame.f_code) is None or frame.f_code.co_name == "<module>":
            return
        caller = frame.f_back
        while caller is not None and package_file(caller.f_code) is None:
            if caller.f_code.co_filename.startswith("<frozen importlib"):
                return  # run by an import, not by the launch
            caller = caller.f_back
        key = (caller.f_code if caller is not None else None, frame.f_code)
        if key not in self.seen:
            self.seen.add(key)
            self.calls.setdefault(key[0], {})[frame.f_code] = caller.f_lineno if caller is not None else 0

    def story(self) -> LaunchPath:
        """The stops of a reader who starts where the launch came in (the module docstring's rule)."""
        path, read, accessors = LaunchPath(), set(), property_codes()
        opened: list[str] = []  # the file the reader has open at each depth

        def callees(code: CodeType | None) -> list[CodeType]:
            """What `code` calls, by line; what a property it uses calls, in its place."""
            found = []
            for callee, _ in sorted(self.calls.get(code, {}).items(), key=lambda item: item[1]):
                found += callees(callee) if callee in accessors else [callee]
            return found

        def read_on(code: CodeType | None, depth: int) -> None:
            for callee in callees(code):
                if callee in read:
                    continue
                read.add(callee)
                file = package_file(callee)
                if code is not None and file == package_file(code):
                    read_on(callee, depth)
                    continue
                assert file is not None
                caller = code.co_qualname if code is not None else ""
                again = len(opened) > depth and opened[depth] == file
                if not again:  # another file at this depth: what was open below it is closed too
                    del opened[depth:]
                    opened.append(file)
                path.stops.append(Stop(file, callee.co_qualname, caller, depth, new_visit=not again))
                read_on(callee, depth + 1)

        read_on(None, 0)
        return path


def import_launcher() -> None:
    """Import every launcher module first: the path is the launch's, not the imports'."""
    import ddp_helpers.kernel.launcher as launcher

    for info in pkgutil.iter_modules(launcher.__path__):
        if info.name != "agent_server":  # the server's own process; importing it here changes nothing
            importlib.import_module(f"ddp_helpers.kernel.launcher.{info.name}")


def follow_launch(run_dir: Path, nproc: int = 2) -> LaunchPath:
    """One launch of the trivial job, traced from the call of `launch` to its result."""
    import_launcher()
    launch = ddp_helpers.launch  # its lazy import is not part of the launch
    recorder = CallRecorder()
    threading.setprofile(recorder)
    sys.setprofile(recorder)
    try:
        result = launch(JOB, nproc=nproc, backend="gloo", run_dir=run_dir)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert result.returncode == 0, result
    return recorder.story()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--launches", type=int, default=2, help="the first starts the agent server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.launches):
            path = follow_launch(Path(tmp) / f"run{n}", args.nproc)
            print(f"launch {n + 1}: {path.report()}\n")


if __name__ == "__main__":
    main()
