"""What comes back from the ranks, as the notebook sees it: `RankResults`, a gathered list, a `RankError`
or a `ValueNotReturned`."""

from __future__ import annotations

import pickle
from typing import Any

from ddp_helpers.errors import LaunchInterrupted, RankError, ValueNotReturned
from ddp_helpers.kernel.launcher.cell_output import shown_text
from ddp_helpers.kernel.launcher.diagnosis import pdb_quit_hint
from ddp_helpers.rank.live_protocol import Error, Interrupted, Reply, Value

MAX_VALUE_CHARS = 10_000  # a cell's value shown in the notebook: list(range(10**6)) would be 6.9 MB


class _Shown:
    """A value that could not travel to the kernel: shown by the repr the rank sent."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class RankResults(dict[int, Any]):
    """The value of a cell's last expression on each rank that ran it (the rank's repr where it cannot travel)."""

    wall_s: float = 0.0

    def __repr__(self) -> str:
        return "\n".join(f"[rank {rank}] {shown_value(value)}" for rank, value in sorted(self.items()))


def shown_value(value: Any) -> str:
    """A cell's value as the cell shows it: its repr, cut where it would flood the notebook."""
    return shown_text(repr(value), MAX_VALUE_CHARS, "the value itself is whole: ranks.gather(name) brings it")


def check_syntax(code: str) -> None:
    """Raise the cell's SyntaxError, with its source line (the compiler leaves it out for ``return``, ``await``)."""
    try:
        compile(code, "<cell>", "exec")
    except SyntaxError as error:
        lines = code.splitlines()
        line = lines[error.lineno - 1] if error.lineno and 0 < error.lineno <= len(lines) else ""
        if not error.text and line:
            error.text, error.offset = line + "\n", error.offset or 1
        text = line.lstrip()
        # the compiler says only "invalid syntax"
        if text.startswith(("%", "!")) and not text.startswith(("%=", "!=")):
            kind = "a shell escape" if text.startswith("!") else "an IPython magic"
            why = (
                f"{text.split()[0]} is {kind}: a rank runs the cell as plain Python, without IPython. Time it "
                "with time.perf_counter(), run a command with subprocess.run(...), or use the magic in a cell "
                "of its own, in the notebook"
            )
            error = SyntaxError(why, ("<cell>", error.lineno, 1, line + "\n"))
        raise error.with_traceback(None) from None


def _refuse_failures(replies: dict[int, Reply]) -> None:
    failed = {r: reply for r, reply in replies.items() if isinstance(reply, Error)}
    if failed:
        message = failure_text(failed) + "\n\nThe ranks are still running, with their state."
        raise RankError(message, errors={r: reply.traceback for r, reply in failed.items()})
    stopped = sorted(r for r, reply in replies.items() if isinstance(reply, Interrupted))
    if stopped:  # not the kernel's Ctrl-C, which `LiveRanks._request` handles: the rank's own
        raise LaunchInterrupted(
            f"interrupted on rank(s) {', '.join(map(str, stopped))}: the cell raised KeyboardInterrupt there "
            "(or the rank got a SIGINT). The ranks are still running, with their state."
        )


def _decoded(reply: Value) -> tuple[Any, str | None]:
    """The value, and None; or the rank's repr and why the value could not travel."""
    if reply.data is None:
        return _Shown(reply.text), "it cannot be pickled on the rank"
    try:
        return pickle.loads(reply.data), None
    except (AttributeError, ImportError) as error:  # pickle stores a class by name
        return _Shown(reply.text), (
            f"its class is not importable in the kernel ({error}): a class defined in a cell exists only on the ranks"
        )
    except Exception as error:  # noqa: BLE001 - any unpickling failure means the same thing here
        return _Shown(reply.text), f"it cannot be unpickled in the kernel ({type(error).__name__}: {error})"


def cell_results(replies: dict[int, Reply]) -> RankResults:
    """Each rank's value of the cell, in rank order; raises `RankError` or `LaunchInterrupted`."""
    _refuse_failures(replies)
    return RankResults(
        {r: _decoded(reply)[0] for r, reply in sorted(replies.items()) if isinstance(reply, Value)}
    )


def gathered(name: str, replies: dict[int, Reply], targets: list[int]) -> list[Any]:
    """The values bound to `name`, in the order of `targets`; `NameError`, or `ValueNotReturned`."""
    missing = sorted(r for r, reply in replies.items() if isinstance(reply, Error))
    if missing:
        error = replies[missing[0]]
        assert isinstance(error, Error)
        raise NameError(
            f"{error.error.removeprefix('NameError: ')} on rank(s) {', '.join(map(str, missing))}"
        )
    _refuse_failures(replies)
    decoded = {rank: _decoded(replies[rank]) for rank in targets}  # type: ignore[arg-type]
    reasons = {rank: why for rank, (_, why) in decoded.items() if why is not None}
    if reasons:
        shown = "\n".join(f"[rank {r}] {repr(decoded[r][0])[:200]}" for r in sorted(reasons))
        raise ValueNotReturned(
            f"{name} cannot be brought back from rank(s) {', '.join(map(str, sorted(reasons)))}: "
            f"{reasons[min(reasons)]}. Its repr there (what a cell ending in {name} shows):\n{shown}\n"
            f"Gather something that pickles instead: numbers, tensors, or lists and dicts of them.",
            reprs={r: repr(decoded[r][0]) for r in reasons},
        )
    return [value for value, _ in decoded.values()]


def failure_text(failed: dict[int, Error]) -> str:
    """The first failed rank's error and traceback, then the others' first lines."""
    first = min(failed)
    message = f"rank {first} failed: {failed[first].error}\n\n{failed[first].traceback}"
    message += pdb_quit_hint(failed[first].error)
    others = [r for r in sorted(failed) if r != first]
    if others:
        message += "\n\nalso failed on rank(s) " + ", ".join(
            f"{r} ({failed[r].error.splitlines()[0]})" for r in others
        )
    return message
