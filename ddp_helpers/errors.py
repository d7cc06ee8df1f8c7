"""The exceptions that `launch` raises. Every one of them subclasses `LaunchError`."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """Base class: something went wrong launching or running a distributed job."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's own stack, which would only hide the
        # worker's root cause under frames of ddp_helpers.
        return f"{type(self).__name__}: {self}".splitlines()


class InvalidLaunchArguments(LaunchError, ValueError):
    """The arguments were refused before any process was started."""


class RunDirInUse(InvalidLaunchArguments):
    """Another launch, in this process or another, is running into the same run_dir."""


class RanksNotRunning(LaunchError):
    """The live ranks were stopped (after a failure, a hang or an interrupt, or by ``%ranks stop``)."""


class WorkerFailed(LaunchError):
    """A worker process exited with an error.

    The first line of the message names the rank and the exception, for example
    ``rank 1 failed: ZeroDivisionError: division by zero``. The root-cause traceback
    follows (from torchelastic's error file when the worker used ``@record``,
    otherwise from the rank's stderr). A rank that left no traceback (``sys.exit("...")``, an
    argparse error) is described by the last lines it wrote to stderr.
    """

    def __init__(
        self,
        rank: int,
        exitcode: int,
        error: str,
        traceback: str,
        *,
        hint: str = "",
        run_dir: str | None = None,
        logs: dict[int, list[str]] | None = None,
        stderr_tail: str = "",
        headline: str = "",
        traceback_title: str = "root-cause traceback:",
        left_early: list[int] | None = None,
    ) -> None:
        self.rank = rank
        self.left_early = left_early or []  # ranks that exited with code 0 while `rank` still waited
        self.exitcode = exitcode
        self.error = error
        self.traceback = traceback
        self.hint = hint
        self.run_dir = run_dir
        self.logs = logs or {}
        self.stderr_tail = stderr_tail
        lines = [headline or f"rank {rank} failed: {error}", f"exit code {exitcode}"]
        if hint:
            lines.append(f"hint: {hint}")
        if traceback:
            lines += ["", traceback_title, traceback.rstrip()]
        elif stderr_tail:
            lines += ["", f"the last lines of rank {rank}'s stderr:", stderr_tail.rstrip()]
        if run_dir:
            lines += ["", f"all logs are under {run_dir}/logs"]
        super().__init__("\n".join(lines))


class LaunchTimeout(LaunchError):
    """The run made no progress (no output line, no metrics line) within the timeout and was killed.

    `stacks`: where each rank that still ran was waiting, by rank (its Python frames, innermost first,
    each followed by its source line), for the ranks that could say (see stack_dumps.py)."""

    def __init__(
        self,
        message: str,
        *,
        silent_ranks: list[int],
        run_dir: str | None = None,
        stacks: dict[int, str] | None = None,
    ) -> None:
        self.silent_ranks = silent_ranks
        self.run_dir = run_dir
        self.stacks = stacks or {}
        super().__init__(message)


class LaunchFailed(LaunchError):
    """torchrun itself failed, with no worker to blame (e.g. the rendezvous never completed)."""

    def __init__(self, message: str, *, returncode: int, output: str = "") -> None:
        self.returncode = returncode
        self.output = output
        super().__init__(message)


class LaunchInterrupted(LaunchError, KeyboardInterrupt):
    """The cell was interrupted; every process of the run has been stopped.

    Also a KeyboardInterrupt, so code that stops on an interrupt (``except KeyboardInterrupt``,
    IPython, pytest) still does.
    """

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"KeyboardInterrupt: {self}"]


class RankError(LaunchError):
    """Code sent to live ranks (`start_ranks`, ``%%ranks``) raised on one or more ranks.

    The first line names the first failing rank and its exception, for example
    ``rank 1 failed: ZeroDivisionError: division by zero``; that rank's traceback follows. The
    ranks are still alive, with their state.
    """

    def __init__(self, message: str, *, errors: dict[int, str]) -> None:
        self.errors = errors  # rank -> that rank's formatted traceback
        self.ranks = sorted(errors)
        super().__init__(message)


class ValueNotReturned(LaunchError, TypeError):
    """A live rank's value could not be brought back to the kernel (`LiveRanks.gather`).

    It cannot be pickled on the rank (a lock, an open file), or unpickled in the kernel (an object of
    a class defined in a cell, which exists only on the ranks). `reprs` maps each such rank to the
    value's repr there, which a cell's value would show instead.
    """

    def __init__(self, message: str, *, reprs: dict[int, str]) -> None:
        self.reprs = reprs
        self.ranks = sorted(reprs)
        super().__init__(message)
