"""In a forked worker: become what ``python -u script.py`` would have been (see worker_forks.py)."""

from __future__ import annotations

import atexit
import builtins
import ctypes
import gc
import importlib.machinery
import os
import signal
import sys
import threading
import traceback
import types
from typing import Any

from .. import stack_dumps

PR_SET_PDEATHSIG = 1


def become_worker(request: dict, stdout_fd: int, stderr_fd: int, close: list[int]) -> int:
    """In the forked child: become ``python -u script args...`` in torchrun's environment."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)  # torchrun handles these in the agent: a fresh worker's default
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what a fresh Python installs
    os.setsid()  # torchrun's start_new_session: it stops a worker with killpg
    _die_with_fork_server()
    for fd in close:
        os.close(fd)
    for fd, target in ((stdout_fd, 1), (stderr_fd, 2)):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    stack_dumps.register_in_run()  # where it waits, if the run hangs (see stack_dumps.py)
    script, *args = request["argv"]
    sys.argv = [script, *args]
    if not sys.flags.safe_path:  # then sys.path[0] is the server's folder: the script's, as Python sets it
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    _as_if_imported_now()
    return run_script(script)


def _die_with_fork_server() -> None:
    """A fork server is killed only with its run (SIGKILL, once the run's grace period is over): its
    workers go with it, and none is left running outside the run's process tree."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(128 + signal.SIGKILL)


def _as_if_imported_now() -> None:
    """What a fresh interpreter reads from its environment when it imports torch and numpy."""
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # from the OS's entropy, as at import: each worker its own


def run_script(path: str) -> int:
    """Run `path` as ``__main__`` and end as Python's own exit would; returns the exit code."""
    try:
        with open(path, "rb") as source_file:
            source = source_file.read()
    except OSError as error:  # what Python says, with its exit code
        print(
            f"{sys.executable}: can't open file {path!r}: [Errno {error.errno}] {error.strerror}",
            file=sys.stderr,
        )
        return 2
    main = _main_module(path)
    code = 0
    try:
        # dont_inherit: this module's own `from __future__ import annotations` must not reach the script
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as exit_:
        code = _system_exit_code(exit_)
    except BaseException as error:  # noqa: BLE001 - uncaught in the script: what Python prints
        error.__traceback__ = _from_script(error.__traceback__, path)  # what Python's excepthook prints
        sys.excepthook(type(error), error, error.__traceback__)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
        del error
    _exit_as_python_does(main)
    if code == -signal.SIGINT:  # Python ends an uncaught Ctrl-C by the signal itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code & 0xFF


def _main_module(path: str) -> types.ModuleType:
    """A ``__main__`` for the script that stays (runpy would put the server's back once it returns, and
    threads and atexit functions still run after that, pickling classes of the script)."""
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    return main


def _exit_as_python_does(main: types.ModuleType) -> None:
    """Join non-daemon threads, run the atexit functions, free the script's globals (an unclosed file
    writes its tail when it is freed), flush: each step even if an earlier one failed."""
    for step in (
        threading._shutdown,  # type: ignore[attr-defined]  # private: what the interpreter calls at exit
        atexit._run_exitfuncs,
        main.__dict__.clear,
        gc.collect,
        sys.stdout.flush,
        sys.stderr.flush,
    ):
        try:
            step()
        except BaseException:  # noqa: BLE001 - as Python's exit: report it and go on
            traceback.print_exc()


def _system_exit_code(exit_: SystemExit) -> int:
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    print(exit_.code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits with 1
    return 1


def _from_script(tb: Any, path: str) -> Any:
    """The traceback from the script's own first frame on, as ``python script.py`` prints it (None for
    a SyntaxError: no frame of the script ran, and Python prints only where the error is)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next
    return tb
