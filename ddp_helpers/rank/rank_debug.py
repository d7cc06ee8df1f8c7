"""pdb on a live rank, typed at in the notebook: its input and output go over the rank's channel.

Rank side (the server imports it; it imports nothing of the kernel side). A rank has no terminal, so
pdb here reads and writes a `ChannelIO`: what pdb prints is kept until it reads a command, then sent to
the kernel with its prompt (`protocol.Prompt`); the kernel asks the learner (Jupyter's input box) and
sends the line back (`protocol.Answer`).

While a rank is paused, the others run on until they wait for it in a collective. So that they wait
there instead of failing on the process group's timeout, `Timeouts` stretches every group's timeout
for the cell, and restores it when the cell ends. (``torch.distributed.breakpoint`` in torch 2.14 also
stretches every group's timeout, to 3600 s, but never restores it; in torch 2.7 it changes none.) A collective takes its timeout when it starts: the kernel asks every rank to stretch
before the cell runs (`Run.stretch`) wherever a rank may pause.
"""

from __future__ import annotations

import bdb
import pdb
import sys
import types
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_helpers.rank.live_protocol import Answer, Prompt

SERVER_FILES = (str(Path(__file__).with_name("live_server.py")), str(Path(__file__)))
DEBUG_TIMEOUT_S = 3600.0  # torch.distributed.breakpoint's own stretch (torch 2.14)
QUIT_COMMANDS = ("q", "quit", "exit")


class DebuggerQuit(Exception):
    """The learner quit pdb (``q``) on this rank: the cell stops here."""


class ChannelIO:
    """pdb's stdin and stdout on a rank: output is kept, and sent with the prompt when pdb reads."""

    def __init__(self, conn: Connection | None, cell_id: Callable[[], int], prompt: str) -> None:
        self.conn = conn
        self.cell_id = cell_id
        self.prompt = prompt
        self.kept: list[str] = []
        self.interrupted = False  # a SIGINT came while pdb waited: the cell ends as interrupted

    def write(self, text: str) -> int:
        self.kept.append(text)
        return len(text)

    def flush(self) -> None:
        pass  # sent with the next prompt; what is left at the end goes to the rank's log (`drain`)

    def readline(self) -> str:
        text = "".join(self.kept)
        self.kept.clear()
        text = text.removesuffix(self.prompt)  # the kernel shows its own
        if self.conn is None:
            return ""  # no kernel to ask: end of input
        try:
            self.conn.send(Prompt(self.cell_id(), text, self.prompt))
            answer = self.conn.recv()
        except KeyboardInterrupt:
            self.interrupted = True
            return "q\n"
        except (EOFError, OSError):
            return ""  # the kernel is gone: pdb reads end of input, and quits
        return answer.line + "\n" if isinstance(answer, Answer) else ""

    def drain(self) -> None:
        """Print what pdb wrote after its last prompt ("--Return--" and the like) to the rank's log."""
        text = "".join(self.kept).removesuffix(self.prompt)
        self.kept.clear()
        if text.strip():
            print(text, end="" if text.endswith("\n") else "\n", flush=True)


class RankPdb(pdb.Pdb):
    """pdb reading and writing a `ChannelIO`; no SIGINT handler of its own (the server has one).

    It never stops in the server's own frames: stepping off the end of a cell runs on to the next stop.
    """

    def __init__(self, io: ChannelIO) -> None:
        super().__init__(stdin=io, stdout=io, nosigint=True, readrc=False)  # type: ignore[arg-type]
        self.prompt = io.prompt

    def stop_here(self, frame: types.FrameType) -> bool:
        code = frame.f_code
        if code.co_filename in SERVER_FILES and code is not Debugger.dist_breakpoint.__code__:
            return False  # the server's frames, around the cell: never where the learner steps
        return super().stop_here(frame)


class Timeouts:
    """Every process group's timeout, stretched while a rank may pause in pdb, then restored."""

    def __init__(self) -> None:
        self.saved: dict[Any, timedelta] = {}

    def stretch(self, seconds: float = DEBUG_TIMEOUT_S) -> bool:
        """Stretch each group's timeout to `seconds` (once per cell); False where torch offers no way."""
        setter = timeout_setter()
        if setter is None or not dist.is_initialized():
            return False
        for group in process_groups():
            now = group_timeout(group)
            if group not in self.saved and now is not None:  # a timeout it cannot read, it cannot set back
                self.saved[group] = now
                setter(timedelta(seconds=seconds), group)
        return True

    def restore(self) -> None:
        setter = timeout_setter()
        saved, self.saved = self.saved, {}
        if setter is None or not dist.is_initialized():
            return
        for group, timeout in saved.items():
            setter(timeout, group)


def timeout_setter(c10d: types.ModuleType | None = None) -> Callable[..., None] | None:
    """``set_timeout`` (torch 2.14), else ``_set_pg_timeout`` (torch 2.7's private name), else None."""
    c10d = dist.distributed_c10d if c10d is None else c10d
    return getattr(c10d, "set_timeout", None) or getattr(c10d, "_set_pg_timeout", None)


def process_groups(c10d: types.ModuleType | None = None) -> list[Any]:
    """Every group (torch's private ``_pg_map``, as torch.distributed.breakpoint reads it), else the default."""
    c10d = dist.distributed_c10d if c10d is None else c10d
    groups = getattr(c10d, "_pg_map", None)
    return list(groups) if groups else [c10d._get_default_group()]


def group_timeout(group: Any = None) -> timedelta | None:
    """The group's timeout now (default: the default group), as its backend's options hold it (gloo's,
    NCCL's); None where they do not say."""
    group = dist.distributed_c10d._get_default_group() if group is None else group
    for device in ("cpu", "cuda"):
        try:
            timeout: timedelta = group._get_backend(torch.device(device)).options._timeout
            return timeout
        except Exception:  # noqa: BLE001 - no backend for this device, or other options: the next one
            continue
    return None


class Debugger:
    """A rank's pdb sessions: `breakpoint()`, ``pdb.set_trace()``, the cell's first line, post-mortem."""

    def __init__(self, conn: Connection | None, rank: int, cell_id: Callable[[], int]) -> None:
        self.conn = conn
        self.rank = rank
        self.cell_id = cell_id
        self.timeouts = Timeouts()
        self.io: ChannelIO | None = None  # the session of this cell, if it paused

    def new_pdb(self) -> RankPdb:
        if self.io is None:
            self.io = ChannelIO(self.conn, self.cell_id, f"rank {self.rank} (Pdb) ")
        self.timeouts.stretch()  # this rank's own collectives, after it continues
        return RankPdb(self.io)

    def set_trace(self, frame: types.FrameType | None = None) -> None:
        self.new_pdb().set_trace(frame or sys._getframe().f_back)

    def breakpointhook(self, *args: Any, **kwargs: Any) -> None:
        self.new_pdb().set_trace(sys._getframe().f_back)

    def run(self, code: types.CodeType, namespace: dict[str, Any]) -> None:
        """Run a cell's code in pdb, stopped at its first line (`Bdb.run`, but ``q`` is not swallowed)."""
        debugger = self.new_pdb()
        debugger.reset()
        sys.settrace(debugger.trace_dispatch)
        try:
            exec(code, namespace)
        finally:
            debugger.quitting = True
            sys.settrace(None)

    def post_mortem(self, error: BaseException | None) -> None:
        if error is None or error.__traceback__ is None:
            raise LookupError("no cell has raised on this rank yet: there is nothing to debug")
        tb = error.__traceback__
        while tb.tb_next is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell "):
            tb = tb.tb_next  # from the cell's own frames on: the server's are noise
        debugger = self.new_pdb()
        debugger.reset()
        debugger.interaction(None, tb)

    def end_cell(self) -> None:
        """After a cell: pdb's last words to the log, no tracing left behind, the timeouts back."""
        if self.io is not None:
            self.io.drain()
            sys.settrace(None)  # a cell stepped off its end: the next cell must not start in pdb
            frame: types.FrameType | None = sys._getframe()
            while frame is not None:
                frame.f_trace = None
                frame = frame.f_back
        self.io = None
        self.timeouts.restore()

    def quit_error(self, error: BaseException) -> BaseException:
        """BdbQuit as the learner should read it: they quit, or an interrupt did."""
        if self.io is not None and self.io.interrupted:
            return KeyboardInterrupt()
        if isinstance(error, bdb.BdbQuit):
            message = f"you quit the debugger on rank {self.rank}: the cell stopped there"
            return DebuggerQuit(message).with_traceback(error.__traceback__)
        return error

    def dist_breakpoint(
        self, rank: int = 0, skip: int = 0, timeout_s: float | None = DEBUG_TIMEOUT_S
    ) -> None:
        """``torch.distributed.breakpoint`` on a live rank: pdb on `rank`, every rank waits in a barrier.

        torch's own reads ``/dev/stdin``, which a rank does not have; this is the same protocol
        (`skip` the first calls, stretch the timeouts, barrier) with the notebook as the terminal.
        """
        if skip > 0 and _skipped(skip):
            return
        if timeout_s is not None:
            self.timeouts.stretch(timeout_s)
        if dist.get_rank() == rank:  # as torch does: stop here, before the barrier the others wait in
            debugger = self.new_pdb()
            debugger.message(f"Type 'up' to get to the frame that called dist.breakpoint(rank={rank})")
            debugger.set_trace(sys._getframe())
        dist.barrier()


_skip_counts: dict[int, int] = {}


def _skipped(skip: int) -> bool:
    """`skip`: skip the first `skip` calls from this call site. (torch keys its count on the exception
    being handled, `hash(traceback.format_exc())`, so outside an `except` its calls share one count.)"""
    caller = sys._getframe(2)
    key = hash((caller.f_code, caller.f_lasti))
    _skip_counts[key] = _skip_counts.get(key, 0) + 1
    return _skip_counts[key] <= skip


def install(debugger: Debugger) -> None:
    """Make `breakpoint()`, ``pdb.set_trace()`` and ``torch.distributed.breakpoint`` open pdb in the notebook."""
    sys.breakpointhook = debugger.breakpointhook
    pdb.set_trace = debugger.set_trace  # type: ignore[assignment]
    dist.breakpoint = debugger.dist_breakpoint
