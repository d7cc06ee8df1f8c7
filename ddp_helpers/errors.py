"""The exceptions that `launch` raises. Every one of them subclasses `LaunchError`."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """Base class: something went wrong launching or running a distributed job."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's stack, which would hide the worker's root cause
        return f"{type(self).__name__}: {self}".splitlines()


class InvalidLaunchArguments(LaunchError, ValueError):
    """The arguments were refused before any process was started."""


class RunDirInUse(InvalidLaunchArguments):
    """Another launch, in this process or another, is running into the same run_dir."""


class RanksNotRunning(LaunchError):
    """The live ranks were stopped (after a failure, a hang or an interrupt, or by ``%ranks stop``)."""


class WorkerFailed(LaunchError):
    """A rank exited with an error: ``rank 1 failed: ZeroDivisionError: ...``, then its traceback or last lines."""

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
        self.rank, self.exitcode, self.error = rank, exitcode, error
        self.traceback, self.hint = traceback, hint
        self.left_early = left_early or []  # ranks that exited with code 0 while `rank` still waited
        self.run_dir, self.logs, self.stderr_tail = run_dir, logs or {}, stderr_tail
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
    """No output and no metrics line within the timeout: the run was stopped. `stacks`: where each rank waited."""

    def __init__(
        self,
        message: str,
        *,
        silent_ranks: list[int],
        run_dir: str | None = None,
        stacks: dict[int, str] | None = None,
    ) -> None:
        self.silent_ranks, self.run_dir, self.stacks = silent_ranks, run_dir, stacks or {}
        super().__init__(message)


class LaunchFailed(LaunchError):
    """torchrun itself failed, with no worker to blame (e.g. the rendezvous never completed)."""

    def __init__(self, message: str, *, returncode: int, output: str = "") -> None:
        self.returncode, self.output = returncode, output
        super().__init__(message)


class LaunchInterrupted(LaunchError, KeyboardInterrupt):
    """The cell was interrupted and every process of the run stopped; also a KeyboardInterrupt."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"KeyboardInterrupt: {self}"]


class RankError(LaunchError):
    """Code sent to live ranks raised on some of them (``rank 1 failed: ...`` and its traceback); they live on."""

    def __init__(self, message: str, *, errors: dict[int, str]) -> None:
        self.errors, self.ranks = errors, sorted(errors)  # rank -> that rank's formatted traceback
        super().__init__(message)


class ValueNotReturned(LaunchError, TypeError):
    """A live rank's value could not come back to the kernel (not picklable, or its class exists only there)."""

    def __init__(self, message: str, *, reprs: dict[int, str]) -> None:
        self.reprs, self.ranks = reprs, sorted(reprs)
        super().__init__(message)
