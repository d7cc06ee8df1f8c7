"""Notebook 05's plumbing: launch a case of the pitfalls worker and check that it went wrong the way the
lesson says, so that a pitfall that stops showing fails the cell. Kernel side.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ddp_helpers.errors import LaunchTimeout, WorkerFailed
from ddp_helpers.kernel.launcher.runner import launch
from ddp_helpers.run_contract import SUMMARY_FILE

IN_THE_WORKER = 'pitfalls.py", line'  # a traceback's or a stack's frame in the worker's own file


def printed(run_dir: str | Path, rank: int) -> list[str]:
    """What `rank` printed, from its log file (on one node the local rank is the rank)."""
    logs = sorted(Path(run_dir).glob(f"logs/*/attempt_0/{rank}/stdout.log"))
    return [line for log in logs for line in log.read_text().splitlines()]


def worker_frames(traceback: str) -> list[tuple[str, str]]:
    """(function, source line) of each frame of the pitfalls worker in a traceback, outermost first."""
    lines = traceback.splitlines()
    return [
        (line.rsplit(" in ", 1)[1], lines[i + 1].strip())
        for i, line in enumerate(lines[:-1])
        if IN_THE_WORKER in line
    ]


def line_of_the_worker(stack: str) -> str:
    """The worker's own innermost line in a rank's stack (innermost call first): where its code waits."""
    lines = stack.splitlines()
    return next(lines[i + 1].strip() for i, line in enumerate(lines) if IN_THE_WORKER in line)


def live_cases(live: Any) -> Callable[..., SimpleNamespace]:
    """`run_live(case, fix=False, **extra)` runs a case on live ranks; returns its `.logs` and `.summary`."""

    def run_live(case: str, fix: bool = False, **extra: Any) -> SimpleNamespace:
        summary = live.run_dir / SUMMARY_FILE  # the case's report() writes it there, as in a launch
        summary.unlink(missing_ok=True)
        args = "".join(f", {name}={value!r}" for name, value in extra.items())
        logs = live.run(
            "import contextlib, io\n"
            "out = io.StringIO()\n"
            f"with contextlib.redirect_stdout(out):\n    cases.{case}(rank, world_size, device, {fix}{args})\n"
            "out.getvalue().splitlines()"
        )
        found = json.loads(summary.read_text()) if summary.exists() else None
        return SimpleNamespace(logs=logs, summary=found)

    return run_live


@dataclass
class PitfallRuns:
    """Fresh torchrun jobs of the pitfalls worker on `world` ranks: one per case that fails."""

    worker: Path
    world: int
    backend: str
    failure_timeout: float  # only a safety net: the demos fail by themselves, long before it
    env: dict[str, str] = field(default_factory=dict)  # every case's (the plan's: GPUs hidden on gloo)

    def run_case(self, case: str, *extra: Any, timeout: float | None = None, **options: Any) -> Any:
        """Launch one case; returns the launch's result (raises if it fails)."""
        options = {
            "backend": self.backend,
            "show_ranks": "none",
            "startup_timeout": self.failure_timeout,
            **options,
            "env": {**self.env, **(options.get("env") or {})},
        }
        timeout = self.failure_timeout if timeout is None else timeout
        return launch(
            self.worker, "--case", case, *extra, nproc=self.world, progress="off", timeout=timeout, **options
        )

    def started(self, run_dir: str | Path) -> bool:
        """Whether every rank printed a line: each case that can hang prints one first."""
        return all(printed(run_dir, rank) for rank in range(self.world))

    def expect_failure(
        self,
        case: str,
        *extra: Any,
        expected: type[Exception] | tuple[type[Exception], ...] = WorkerFailed,
        lines: int = 8,
        timeout: float | None = None,
        **options: Any,
    ) -> Any:
        """Launch a case that must fail with `expected`; print the head of the error and return it.

        A hang before every rank printed is a slow start-up: the case runs again with twice the time."""
        timeout = self.failure_timeout if timeout is None else timeout
        # None means no allowance of its own: `timeout` from the launch on, as the launcher reads it
        startup = options.pop("startup_timeout", self.failure_timeout) or timeout
        for _ in range(3):
            try:
                self.run_case(case, *extra, timeout=timeout, startup_timeout=startup, **options)
            except expected as err:
                if isinstance(err, LaunchTimeout) and not self.started(str(err.run_dir)):
                    timeout, startup = 2 * timeout, 2 * startup
                    again = f"timeout={timeout:g}s, startup_timeout={startup:g}s"
                    print(f"(not every rank had started in time: again, with {again})")
                    continue
                text = str(err).splitlines()
                more = "\n..." if len(text) > lines else ""
                print(f"{type(err).__name__}: " + "\n".join(text[:lines]) + more)
                return err
            raise AssertionError(f"the {case!r} pitfall ran to the end: it no longer shows what it should")
        raise AssertionError(f"the {case!r} pitfall never got all {self.world} ranks started")

    def check_mismatch(self, hang_timeout: float, **options: Any) -> str:
        """Run the mismatched all_reduce; raise unless it went wrong there. "named", "hung" or "wrong sums"."""
        extra = ("--pg-timeout", max(hang_timeout, 10))  # it also bounds the ranks' init_process_group
        try:
            result = self.run_case("mismatch", *extra, timeout=3 * hang_timeout, **options)
        except (WorkerFailed, LaunchTimeout) as err:
            logs = {rank: printed(str(err.run_dir), rank) for rank in range(self.world)}
            reached = all(any("all-reducing" in line for line in lines) for lines in logs.values())
            assert reached, f"a rank never reached the all_reduce: {logs}"
            error = err.error if isinstance(err, WorkerFailed) else ""
            named = "mismatch" in error or "nbytes" in error  # only an abort names it
            timed_out = not error or "timed out" in error.lower() or "watchdog" in str(err).lower()
            assert named or timed_out, f"it failed another way: {err}"
            outcome = "named" if named else "hung"
            if named:
                print(f"It aborted and named the mismatch: {error}")
            else:
                print(f"It hung in the all_reduce until a timeout stopped it: {str(err).splitlines()[0]}")
        else:
            logs, outcome = result.logs, ""
            print("It finished without a word.")
        sums = [line for rank in range(self.world) for line in logs[rank] if " gave " in line]
        wrong = [
            line for line in sums if set(ast.literal_eval(line.split(" gave ")[1])) != {float(self.world)}
        ]
        for line in wrong:
            print(f"  a wrong sum (each element should be {self.world}): {line}")
        assert outcome or wrong, f"every rank got the right sum: the bug did not show ({sums})"
        return outcome or "wrong sums"
