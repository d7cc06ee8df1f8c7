"""Where a hung worker waits: its Python stack, asked for with a signal before the run is stopped.

Rank side: imports no torch and nothing of the launcher, which calls `ask`.

A worker that calls `register` (every forked worker does, see launcher/forked_worker.py, and so does
`distributed.setup_distributed`) has faulthandler
write the stack of each of its Python threads to ``logs/stacks/<pid>.txt`` when it receives
`STACK_SIGNAL`. faulthandler writes from the signal handler itself, so a worker blocked in C++ (a
collective, a destructor, a lock) answers too: it is how a run that the launcher stops for a hang
says where each rank was waiting.

A worker is signalled only when its file exists, that is when it registered: the signal's default
action would end a process that did not. The signal is a real-time one that no DDP tool sends
(SLURM and Lightning use SIGUSR1 and SIGUSR2 to ask for a checkpoint or a requeue).
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import IO

# None where the system has no real-time signals (macOS): no worker registers, none is asked
STACK_SIGNAL: int | None = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else None
STACKS_DIR = "stacks"  # in the run's logs/
WAIT_S = 1.0  # a live worker answers within milliseconds; one that does not is left out
SETTLE_S = 0.1  # faulthandler writes a frame at a time: let the dump finish
MAX_FRAMES = 8  # innermost first: where it waits, and the calls of the script that led there

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.MULTILINE)
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.MULTILINE)
# a forked worker's start, below the script's frames: not shown
_LAUNCHER = str(Path(__file__).resolve().parent / "launcher")
_registered: list[IO[str]] = []  # the open dump file, for as long as the worker runs


def register(log_dir: Path) -> None:
    """In a worker: answer `STACK_SIGNAL` with the stack of every Python thread, the main one named.
    Once per process; a folder that cannot be written leaves the worker as it was."""
    if _registered or STACK_SIGNAL is None:
        return
    folder = log_dir / STACKS_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        dump = open(folder / f"{os.getpid()}.txt", "w", buffering=1)  # noqa: SIM115 - open while it runs
    except OSError:
        return
    dump.write(f"main thread 0x{threading.main_thread().ident:016x}\n")
    faulthandler.register(STACK_SIGNAL, file=dump, all_threads=True, chain=False)
    _registered.append(dump)


def register_in_run() -> None:
    """`register` in the logs of the run that started this worker, if ddp_helpers started it."""
    if "DDP_RUN_DIR" in os.environ:
        register(Path(os.environ["DDP_RUN_DIR"]) / "logs")


def ask(pids_by_rank: dict[int, int], log_dir: Path) -> dict[int, str]:
    """Each registered worker's main-thread stack, by rank (see `where_it_waits`); the others: none."""
    if STACK_SIGNAL is None:
        return {}
    files, offsets = {}, {}
    for rank, pid in pids_by_rank.items():
        path = log_dir / STACKS_DIR / f"{pid}.txt"
        try:
            offsets[rank] = path.stat().st_size
            os.kill(pid, STACK_SIGNAL)
        except (OSError, ProcessLookupError):  # never registered, or gone meanwhile
            continue
        files[rank] = path
    deadline = time.monotonic() + WAIT_S
    while files and time.monotonic() < deadline:
        if all(path.stat().st_size > offsets[rank] for rank, path in files.items()):
            break
        time.sleep(0.02)
    time.sleep(SETTLE_S if files else 0)
    stacks = {}
    for rank, path in files.items():
        text = path.read_text(errors="replace")
        where = where_it_waits(text[: text.index("\n") + 1] + text[offsets[rank] :])
        if where:
            stacks[rank] = where
    return stacks


def where_it_waits(dump: str) -> str:
    """The main thread's frames from a dump (header line first), innermost first, each with its source
    line; the frames that started the script (runpy's, a forked worker's launcher frames) are left out."""
    header = re.match(r"main thread (0x[0-9a-f]+)", dump)
    threads = list(_THREAD.finditer(dump))
    main = [i for i, m in enumerate(threads) if header and m[1] == header[1]]
    if not main:
        return ""
    last = main[-1]  # the newest dump's
    end = threads[last + 1].start() if last + 1 < len(threads) else len(dump)
    body = dump[threads[last].end() : end]
    frames = [
        m
        for m in _FRAME.finditer(body)
        if not m["file"].startswith(_LAUNCHER) and m["file"] != "<frozen runpy>"
    ]
    lines = []
    for m in frames[:MAX_FRAMES]:
        lines.append(f'File "{m["file"]}", line {m["line"]} in {m["func"]}')
        linecache.checkcache(m["file"])  # a script edited since an earlier run
        source = linecache.getline(m["file"], int(m["line"])).strip()
        if source:
            lines.append(f"  {source}")
    if len(frames) > MAX_FRAMES:
        lines.append(f"({len(frames) - MAX_FRAMES} outer frames not shown)")
    return "\n".join(lines)
