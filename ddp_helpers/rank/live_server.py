"""One live rank, started by torchrun: join the process group, connect back to the kernel over an
authenticated Unix socket, then run each cell it receives in a namespace that persists between cells.
print() goes to the rank's log file; the rank exits when its socket closes, so none outlives its kernel."""

from __future__ import annotations

import ast
import linecache
import os
import pickle
import select
import signal
import socket
import sys
import threading
import traceback
import types
from multiprocessing.connection import Client, Connection
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_helpers.rank.distributed import DistInfo, setup_distributed
from ddp_helpers.rank.live_protocol import (
    ADDRESS_ENV,
    AUTHKEY_ENV,
    Error,
    Exited,
    Interrupted,
    Reply,
    Run,
    Value,
)

CELL_VALUE = "_ddp_cell_value"  # where a cell's last expression is kept until it is sent
REAL_EXIT = os._exit  # the server's own way out; a cell's os._exit is announced first (see announce_exits)


def flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def to_cpu(value: Any) -> Any:
    """Tensors (also inside lists, tuples and dicts) moved to the CPU, so the kernel never touches CUDA."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(v) for v in value) if not hasattr(value, "_fields") else value
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    return value


def encode(cell_id: int, value: Any) -> Value:
    """The value pickled (None where it cannot be), and its repr for display."""
    value = to_cpu(value)
    try:
        text = repr(value)
    except Exception as error:  # a broken __repr__ must not kill the rank
        text = f"<repr failed: {error!r}>"
    try:
        return Value(cell_id, pickle.dumps(value), text)
    except Exception:
        return Value(cell_id, None, text)  # the kernel says that it cannot travel


class Cells:
    """Runs cells in one persistent namespace, IPython-style: the last expression's value is returned."""

    def __init__(self, info: DistInfo) -> None:
        # a module of its own, named __main__: classes defined in a cell can then be pickled
        module = types.ModuleType("__main__")
        module.__dict__.update(torch=torch, dist=dist, nn=nn, rank=info.rank, local_rank=info.local_rank)
        module.__dict__.update(world_size=info.world_size, device=info.device)
        self.namespace = module.__dict__
        sys.modules["__main__"] = module
        self.running = False  # SIGINT raises KeyboardInterrupt only inside a cell
        self.cell_id = 0  # the cell running now (or last run)

    def run(self, cell_id: int, code: str) -> Any:
        self.cell_id = cell_id
        filename = f"<cell {cell_id}>"
        # tracebacks then show the cell's own lines
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        tree = ast.parse(code, filename=filename)
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if last is not None:  # the cell's value, kept in a name, on the last expression's own line
            value = ast.Assign([ast.Name(CELL_VALUE, ast.Store())], last.value)
            tree.body[-1] = ast.fix_missing_locations(ast.copy_location(value, last))
        self.running = True
        try:
            exec(compile(tree, filename, "exec"), self.namespace)
            return self.namespace.pop(CELL_VALUE, None)  # assigned last: never left bound by an error
        finally:
            self.running = False
            flush()


def cell_traceback(error: BaseException) -> str:
    """The traceback from the cell's own frames on (the server's frames are noise to the learner)."""
    frames = traceback.extract_tb(error.__traceback__)
    in_cell = [i for i, f in enumerate(frames) if f.filename.startswith("<cell ")]
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames[in_cell[0] if in_cell else 0 :])
    lines += traceback.format_exception_only(type(error), error)
    return "".join(lines).rstrip()


def watch_for_kernel_exit(conn: Connection) -> None:
    """Exit as soon as the kernel's end of the socket closes, even in the middle of a long cell."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        while True:
            if select.select([sock], [], [], 1.0)[0]:
                try:
                    data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    data = b"x"
                except OSError:
                    data = b""
                if not data:  # EOF: the kernel is gone
                    flush()
                    REAL_EXIT(0)
                threading.Event().wait(0.5)  # a message waits for the main thread; do not spin on it


def announce_exits(conn: Connection, cells: Cells) -> None:
    """Make a cell's ``os._exit(code)`` tell the kernel which cell it left in, and with which code."""
    # torchrun reports failed workers only: without this, a rank leaving with code 0 is silence

    def exit_announced(status: int) -> NoReturn:  # os._exit's own signature
        flush()
        try:
            conn.send(Exited(cells.cell_id, status))
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
        REAL_EXIT(status)

    os._exit = exit_announced


def handle(cells: Cells, request: Run) -> Reply:
    """Answer one request of the kernel."""
    try:
        if request.values is not None:
            cells.namespace.update(pickle.loads(request.values))
        value = cells.run(request.cell_id, request.code)
    except KeyboardInterrupt:
        return Interrupted(request.cell_id)
    except BaseException as error:  # SystemExit too: a cell must not end the rank
        failure = f"{type(error).__name__}: {error}"
        if not request.code.isidentifier():  # a gather of an unbound name is the kernel's NameError alone
            # one line in the log; the whole traceback goes to the notebook's RankError
            print(f"[cell {request.cell_id} failed: {failure}]", file=sys.stderr, flush=True)
        return Error(request.cell_id, failure, cell_traceback(error))
    return encode(request.cell_id, value)


def serve(conn: Connection, cells: Cells) -> None:
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return  # the kernel is gone
        except KeyboardInterrupt:
            continue  # an interrupt that arrived after the cell ended
        if request is None:  # the kernel's shutdown
            return
        try:
            reply = handle(cells, request)
        except KeyboardInterrupt:
            reply = Interrupted(request.cell_id)
        conn.send(reply)


def main() -> None:
    info = setup_distributed()
    conn = Client(os.environ[ADDRESS_ENV], authkey=bytes.fromhex(os.environ.pop(AUTHKEY_ENV)))
    cells = Cells(info)

    def on_sigint(signum: int, frame: types.FrameType | None) -> None:
        if cells.running:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)  # its stack on request: setup_distributed registered it
    conn.send((info.rank, os.getpid()))
    threading.Thread(target=watch_for_kernel_exit, args=(conn,), daemon=True).start()
    announce_exits(conn, cells)
    try:
        serve(conn, cells)
    finally:
        conn.close()
        if dist.is_initialized():
            # Leave without a final collective: a rank interrupted mid-collective would hang it.
            flush()
            REAL_EXIT(0)


if __name__ == "__main__":
    main()
