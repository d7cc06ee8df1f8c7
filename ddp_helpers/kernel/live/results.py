"""What comes back from the ranks (`Value` or `Error` replies), as the notebook sees it: `RankResults`,
a gathered list, a `RankError` or a `ValueNotReturned`."""

from __future__ import annotations

import pickle
from typing import Any

from ddp_helpers.errors import LaunchInterrupted, RankError, ValueNotReturned
from ddp_helpers.kernel.launcher.cell_output import shown_text
from ddp_helpers.kernel.launcher.diagnosis import pdb_quit_hint
from ddp_helpers.rank.live_protocol import Error, Interrupted, Reply, Value

MAX_VALUE_CHARS = 10_000  # a cell's value shown in the notebook: list(range(10**6)) would be 6.9 MB
NOT_PICKLED = "it cannot be pickled on the rank"


class _Shown:
    """A value that could not travel to the kernel: shown by the repr the rank sent."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class RankResults(dict[int, Any]):
    """The value of a cell's last expression on each rank that ran it: ``{rank: value}``."""

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
        if not error.text and error.lineno and 0 < error.lineno <= len(lines):
            error.text = lines[error.lineno - 1] + "\n"
            error.offset = error.offset or 1
        line = lines[error.lineno - 1] if error.lineno and 0 < error.lineno <= len(lines) else ""
        why = _ipython_syntax(line)
        if why is not None:  # the compiler says only "invalid syntax"
            error = SyntaxError(why, ("<cell>", error.lineno, 1, line + "\n"))
        raise error.with_traceback(None) from None


def _ipython_syntax(line: str) -> str | None:
    """Why `line` cannot run on a rank, where it is IPython's and not Python's (a magic, a shell escape)."""
    text = line.lstrip()
    if not text.startswith(("%", "!")) or text.startswith(("%=", "!=")):
        return None
    kind = "a shell escape" if text.startswith("!") else "an IPython magic"
    return (
        f"{text.split()[0]} is {kind}: a rank runs the cell as plain Python, without IPython. Time it "
        "with time.perf_counter(), run a command with subprocess.run(...), or use the magic in a cell "
        "of its own, in the notebook"
    )


def cell_results(replies: dict[int, Reply]) -> RankResults:
    """Each rank's value of the cell."""
    failed = {r: reply for r, reply in replies.items() if isinstance(reply, Error)}
    if failed:
        raise _rank_error(failed)
    _refuse_interrupted(replies)
    # in rank order, whichever rank replied first: `list(results.values())` is rank 0's value first
    return RankResults(
        {r: _decode(reply) for r, reply in sorted(replies.items()) if isinstance(reply, Value)}
    )


def _refuse_interrupted(replies: dict[int, Reply]) -> None:
    stopped = sorted(r for r, reply in replies.items() if isinstance(reply, Interrupted))
    if stopped:  # not the kernel's Ctrl-C, which `ranks.request` handles: the rank's own
        raise LaunchInterrupted(
            f"interrupted on rank(s) {', '.join(map(str, stopped))}: the cell raised KeyboardInterrupt there "
            "(or the rank got a SIGINT). The ranks are still running, with their state."
        )


def gathered(name: str, replies: dict[int, Reply], targets: list[int]) -> list[Any]:
    """The values bound to `name`, in the order of `targets`."""
    missing = {r: reply for r, reply in replies.items() if isinstance(reply, Error)}
    if missing:
        raise NameError(f"{missing[min(missing)].error} on rank(s) {', '.join(map(str, sorted(missing)))}")
    _refuse_interrupted(replies)
    values, reprs, reasons = [], {}, {}
    for rank in targets:
        reply = replies[rank]
        assert isinstance(reply, Value)  # an error or an interrupt was raised above, an exit by `request`
        if reply.data is None:
            reprs[rank], reasons[rank] = reply.text, NOT_PICKLED
            continue
        try:
            values.append(pickle.loads(reply.data))
        except Exception as error:  # noqa: BLE001 - any unpickling failure means the same thing here
            reprs[rank], reasons[rank] = reply.text, _why_not_returned(error)
    if reprs:
        first = min(reprs)
        shown = "\n".join(f"[rank {r}] {reprs[r][:200]}" for r in sorted(reprs))
        raise ValueNotReturned(
            f"{name} cannot be brought back from rank(s) {', '.join(map(str, sorted(reprs)))}: "
            f"{reasons[first]}. Its repr there (what a cell ending in {name} shows):\n{shown}\n"
            f"Gather something that pickles instead: numbers, tensors, or lists and dicts of them.",
            reprs=reprs,
        )
    return values


def _rank_error(failed: dict[int, Error]) -> RankError:
    message = failure_text(failed) + "\n\nThe ranks are still running, with their state."
    return RankError(message, errors={r: reply.traceback for r, reply in failed.items()})


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


def _decode(reply: Value) -> Any:
    if reply.data is None:
        return _Shown(reply.text)
    try:
        return pickle.loads(reply.data)
    except Exception:  # e.g. a class that exists only on the rank
        return _Shown(reply.text)


def _why_not_returned(error: Exception) -> str:
    if isinstance(error, AttributeError | ModuleNotFoundError | ImportError):
        # pickle stores a class by name: one defined in a cell exists only on the ranks
        return f"its class is not importable in the kernel ({error}): a class defined in a cell exists only on the ranks"
    return f"it cannot be unpickled in the kernel ({type(error).__name__}: {error})"
