"""Where a hung worker waits: its Python stack, asked for with a signal before the run is stopped.
faulthandler writes it from the signal handler, so a rank blocked in a collective answers too; a worker is
signalled only once its file exists and records its start time (the signal's default action kills)."""

from __future__ import annotations

import faulthandler
import linecache
import os
import re
import signal
import socket
import sysconfig
import threading
import time
from pathlib import Path
from typing import IO

from ddp_helpers import run_contract

# None where the system has no real-time signals (macOS): no worker registers, none is asked
STACK_SIGNAL: int | None = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else None
STACKS_DIR = run_contract.STACKS_DIR  # in the run's logs/
WAIT_S = 2.0  # a live worker answers within milliseconds; one that does not is left out
POLL_S = 0.05  # faulthandler writes a few bytes at a time, the main thread last: read once it stops
MAX_FRAMES = 8  # innermost first: where it waits, and the calls that led there

FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.MULTILINE)
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-f]+)", re.MULTILINE)
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_registered: list[IO[str]] = []  # the open dump file, for as long as the worker runs
# The launcher puts WORKER_SITE first on the ranks' PYTHONPATH and sets REGISTER_ENV=1: its
# sitecustomize.py registers every rank before the script's first line (it reads this name too).
REGISTER_ENV = run_contract.STACK_DUMPS_ENV
WORKER_SITE = Path(__file__).resolve().parent / "worker_site"


def _dump_file(log_dir: Path, pid: int) -> Path:
    # the host too: nodes that share a run_dir (or pods, whose pids repeat) must not share a file
    return log_dir / STACKS_DIR / f"{socket.gethostname()}-{pid}.txt"


def register(log_dir: Path) -> None:
    """In a worker, once: answer `STACK_SIGNAL` with the stack of every Python thread, the main one named."""
    if _registered or STACK_SIGNAL is None:
        return
    path = _dump_file(log_dir, os.getpid())
    partial = path.with_suffix(".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        dump = open(partial, "w", buffering=1)  # noqa: SIM115 - open while the worker runs
        dump.write(f"main thread 0x{threading.main_thread().ident:x} started {_start_time(os.getpid())}\n")
        faulthandler.register(STACK_SIGNAL, file=dump, all_threads=True, chain=False)
        os.replace(partial, path)  # now the launcher may signal it
    except OSError:
        return
    _registered.append(dump)


def register_in_run() -> None:
    """`register` in the logs of this worker's run, where ``DDP_RUN_DIR`` names it."""
    if run_contract.RUN_DIR_ENV in os.environ:
        register(Path(os.environ[run_contract.RUN_DIR_ENV]) / run_contract.LOGS_DIR)


def ask(pids_by_rank: dict[int, int], log_dir: Path) -> dict[int, str]:
    """Each registered worker's main-thread stack, by rank (`where_it_waits`). Never raises."""
    stacks = {rank: where_it_waits(dump) for rank, dump in ask_dumps(pids_by_rank, log_dir).items()}
    return {rank: where for rank, where in stacks.items() if where}


def ask_dumps(pids_by_rank: dict[int, int], log_dir: Path) -> dict[int, str]:
    """Each registered worker's new dump, by rank, after its file's header line. Never raises."""
    if STACK_SIGNAL is None:
        return {}
    files, offsets, headers = {}, {}, {}
    for rank, pid in pids_by_rank.items():
        path = _dump_file(log_dir, pid)
        try:
            with open(path, errors="replace") as fh:
                headers[rank] = fh.readline()
            if not headers[rank].rstrip().endswith(f" started {_start_time(pid)}"):
                continue  # an earlier process's file, whose pid this one reuses: not registered yet
            offsets[rank] = path.stat().st_size
            os.kill(pid, STACK_SIGNAL)
        except OSError:  # never registered, or gone meanwhile
            continue
        files[rank] = path
    _wait_until_written(files, offsets)
    dumps = {}
    for rank, path in files.items():
        try:
            text = path.read_text(errors="replace")  # ASCII: faulthandler escapes the rest
        except OSError:
            continue
        dumps[rank] = headers[rank] + text[offsets[rank] :]
    return dumps


def _start_time(pid: int) -> str:
    """When process `pid` started (/proc/PID/stat's 22nd field), "" without /proc: a reused pid differs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return ""
    return stat[stat.rindex(b")") + 2 :].split()[19].decode()  # fields after the command's ")"; 22 is [19]


def _wait_until_written(files: dict[int, Path], offsets: dict[int, int]) -> None:
    """Until every file has grown and then stopped growing, or `WAIT_S` is over."""
    deadline = time.monotonic() + WAIT_S
    previous: dict[int, int] = {}
    while files and time.monotonic() < deadline:
        time.sleep(POLL_S)
        sizes = {}
        for rank, path in files.items():
            try:
                sizes[rank] = path.stat().st_size
            except OSError:
                sizes[rank] = offsets[rank]
        if sizes == previous and all(sizes[rank] > offsets[rank] for rank in files):
            return
        previous = sizes


def where_it_waits(dump: str) -> str:
    """The main thread's frames, innermost first, with their lines; then the script's own, if not shown."""
    main = main_thread(dump)
    frames = [m for m in FRAME.finditer(main) if m["file"] != "<frozen runpy>"]
    shown = frames[:MAX_FRAMES]
    own = next((m for m in frames if _is_the_scripts(m["file"])), None)
    lines = [line for m in shown for line in _with_source(m)]
    if own is not None and own not in shown:
        lines += ["...", *_with_source(own)]
    return "\n".join(lines)


def main_thread(dump: str) -> str:
    """The newest dump's main-thread part (its frames, innermost first), "" if the dump has none."""
    header = re.match(r"main thread 0x([0-9a-f]+)", dump)
    threads = list(_THREAD.finditer(dump))
    main = [i for i, m in enumerate(threads) if header and int(m[1], 16) == int(header[1], 16)]
    if not main:
        return ""
    last = main[-1]  # the newest dump's
    end = threads[last + 1].start() if last + 1 < len(threads) else len(dump)
    return dump[threads[last].start() : end]


def _is_the_scripts(file: str) -> bool:
    """Not Python's own library, nor an installed package's."""
    return not (file.startswith(("<", _STDLIB)) or f"-packages{os.sep}" in file)


def _with_source(frame: re.Match[str]) -> list[str]:
    linecache.checkcache(frame["file"])  # a script edited since an earlier run
    source = linecache.getline(frame["file"], int(frame["line"])).strip()
    return [f'File "{frame["file"]}", line {frame["line"]} in {frame["func"]}'] + (
        [f"  {source}"] if source else []
    )
