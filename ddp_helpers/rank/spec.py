"""What an exercise is: the task, the reference answer, the probe, and the known mistakes."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

Seen = list[dict[str, Any]]  # one dict per rank, in rank order: what the ranks saw and did


@dataclass(frozen=True)
class Context:
    """Where an exercise runs: this rank's identity, device and a folder every rank shares."""

    rank: int
    world_size: int
    local_rank: int
    device: Any  # torch.device
    backend: str
    workdir: str  # a fresh folder per check, the same path on every rank


@dataclass(frozen=True)
class Mistake:
    """One known wrong answer: its id (a mutant's `diagnosis`), what the learner is told, and its signature.
    `matches(seen, expected)` looks only at what the ranks did, never at the answer's text."""

    id: str
    message: str
    matches: Callable[[Seen, Seen], bool]
    hint: str = ""


@dataclass(frozen=True)
class Exercise:
    id: str  # "01-shard": the notebook's number, then a word
    notebook: str  # "01"
    title: str
    task: str  # what to write, in a sentence or three (markdown)
    starter: str  # what the exercise cell holds before the learner writes (never passes)
    reference: str  # the solution, shown only when asked
    hint: str  # shown with a failed verdict, before any solution
    setup: Callable[[Context], dict[str, Any]]  # rank side: the names the answer's code starts with
    observe: Callable[[dict[str, Any], Context], dict[str, Any]]  # rank side: plain values, after the answer
    expected: Callable[[int], Seen]  # kernel side: what a right answer leaves, per rank, for a world size
    mistakes: Sequence[Mistake] = ()
    covers: Sequence[str] = ()  # the capstone's lines this exercise has the learner write
    tolerance: float = 1e-9  # floats compared to this (relative and absolute)
    timeout_s: float = 30.0  # a rank silent in the answer this long counts as hung
    # the probe runs as ranks of this many nodes (answer_runner.node_layout), so that LOCAL_RANK used where
    # RANK belongs fails; on the CPU only: a rank's GPU stays cuda:<its real LOCAL_RANK>
    nodes: int = 1


# ------------------------------------------------------------------ comparing what was seen
def close(a: Any, b: Any, tolerance: float = 1e-9) -> bool:
    """Equal, with floats (also inside lists and dicts) compared to `tolerance`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance) or (a != a and b != b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(close(x, y, tolerance) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tolerance) for k in a)
    return bool(a == b)


def differences(seen: Seen, expected: Seen, tolerance: float = 1e-9) -> list[tuple[int, str, Any, Any]]:
    """(rank, field, seen, expected) for each expected field that a rank got wrong."""
    out = []
    for rank, want in enumerate(expected):
        got = seen[rank] if rank < len(seen) else {}
        for name, value in want.items():
            if name not in got or not close(got[name], value, tolerance):
                out.append((rank, name, got.get(name, "(missing)"), value))
    return out


def scaled(values: Sequence[float], reference: Sequence[float]) -> float | None:
    """The one factor k with values == k * reference, or None (reference all zero, or no single factor)."""
    pairs = [(v, r) for v, r in zip(values, reference, strict=True) if abs(r) > 1e-12]
    if not pairs or any(abs(v) > 1e-12 for v, r in zip(values, reference, strict=True) if abs(r) <= 1e-12):
        return None
    k = pairs[0][0] / pairs[0][1]
    return k if all(math.isclose(v, k * r, rel_tol=1e-6, abs_tol=1e-12) for v, r in pairs) else None


def number(value: Any) -> float | None:
    """A number the answer bound (a one-element tensor too) as a float; None for anything else."""
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def field_of(seen: Seen, name: str) -> list[Any]:
    """One field of every rank's observations (None where a rank lacks it)."""
    return [s.get(name) for s in seen]


@contextlib.contextmanager
def environment(values: dict[str, Any]) -> Iterator[None]:
    """`os.environ` holding `values` (as strings) for a `with`, then as it was."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update({name: str(value) for name, value in values.items()})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
