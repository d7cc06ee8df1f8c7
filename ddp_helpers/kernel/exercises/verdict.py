"""A checked answer's verdict: passed, or the named mistake, with what each rank did and a hint."""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

PASSED = "passed"
UNKNOWN = "unknown"  # wrong, and like no catalogued mistake: the differences are shown instead
RAISED = "raised"  # the answer raised on some rank, in no way a catalogued mistake explains
HUNG = "hung"  # some rank did not finish the answer within the exercise's bound
UNWRITTEN = "not written yet"  # the starter as given, an empty cell, or a `...` still in place: nothing ran


@dataclass(repr=False)
class Verdict:
    exercise: str
    passed: bool
    diagnosis: str  # "passed", a mistake's id, or unknown / raised / hung
    message: str
    hint: str = ""
    world_size: int = 0
    seen: list[dict[str, Any]] = field(default_factory=list)  # per rank, only the fields that are checked
    expected: list[dict[str, Any]] = field(default_factory=list)
    differences: list[dict[str, Any]] = field(default_factory=list)  # rank, field, seen, expected
    ranks_restarted: bool = False

    def to_json(self) -> str:
        return json.dumps(_json_safe(asdict(self)), default=repr, allow_nan=False)

    def text(self) -> str:
        if self.passed:
            head = f"✅ {self.exercise}: passed on {self.world_size} rank(s)"
        else:
            head = f"{'✏️' if self.diagnosis == UNWRITTEN else '❌'} {self.exercise}: {self.diagnosis}"
        lines = [head, self.message]
        if self.differences:
            lines.append("what differs from a right answer:")
            lines += [line for d in self.differences[:12] for line in _difference_lines(d)]
        if self.seen and not self.passed:
            lines.append("what each rank did:")
            lines += _rank_lines(self.seen)
        if not self.passed and self.hint:
            lines.append(f"hint: {self.hint}")
            lines.append(f"the solution, when you want it: %exercise solution {self.exercise}")
        return "\n".join(lines)

    __str__ = __repr__ = text  # what a terminal, papermill's text output and a log show

    def _repr_html_(self) -> str:
        """The text, in a box whose edge says passed (green), not written yet (grey) or wrong (red)."""
        colour = "#1a7f37" if self.passed else "#6e7781" if self.diagnosis == UNWRITTEN else "#cf222e"
        return (
            f'<pre style="border-left:4px solid {colour};padding:4px 10px;white-space:pre-wrap">'
            f"{html.escape(self.text())}</pre>"
        )


def _floats(value: Any, change: Any) -> Any:
    """`value` with `change` applied to every float in it (tuples become lists)."""
    if isinstance(value, float):
        return change(value)
    if isinstance(value, list | tuple):
        return [_floats(v, change) for v in value]
    if isinstance(value, dict):
        return {k: _floats(v, change) for k, v in value.items()}
    return value


def _json_safe(value: Any) -> Any:
    """NaN and the infinities as the strings "nan", "inf" and "-inf": JSON has no such numbers."""
    return _floats(value, lambda x: x if math.isfinite(x) else repr(float(x)))


WIDE = 110  # a line of the text longer than this is broken: one item per line


def _short(value: Any, limit: int = 80) -> str:
    """A value in about `limit` characters: a long list's first items and its count; each inner list alike."""
    text = value if isinstance(value, str) else repr(_rounded(value))
    if len(text) <= limit:
        return text
    if isinstance(value, list | tuple) and value:
        if all(isinstance(v, list | tuple) for v in value):
            return "[" + ", ".join(_short(v, max(limit // len(value), 28)) for v in value) + "]"
        return _window(list(value), 0, limit)
    return text[: limit - 3] + "..."


def _window(values: list[Any], start: int, limit: int) -> str:
    """`values` from `start`, as many as fit in `limit`, "..." for what is left out, and the count."""
    shown: list[str] = []
    used = 0
    for value in values[start:]:
        text = _short(value, limit // 2)
        if shown and used + len(text) + 2 > limit - 20:
            break
        shown.append(text)
        used += len(text) + 2
    before = "..., " if start else ""
    after = ", ..." if start + len(shown) < len(values) else ""
    count = f" ({len(values)} in all)" if before or after else ""
    return f"[{before}{', '.join(shown)}{after}]{count}"


def _differing_parts(difference: dict[str, Any], limit: int) -> list[tuple[str, str, str]]:
    """(name, seen, expected) of each differing part: an inner list (drawn[1]), or a long list near its change."""
    parts: list[tuple[str, Any, Any]] = []

    def walk(name: str, seen: Any, expected: Any) -> None:
        nested = isinstance(expected, list) and any(isinstance(v, list) for v in expected)
        if nested and isinstance(seen, list) and len(seen) == len(expected) and seen != expected:
            for i, (s, e) in enumerate(zip(seen, expected, strict=True)):
                if s != e:
                    walk(f"{name}[{i}]", s, e)
        else:
            parts.append((name, seen, expected))

    walk(str(difference["field"]), difference["seen"], difference["expected"])
    out = []
    for name, seen, expected in parts:
        if isinstance(seen, list) and isinstance(expected, list) and len(seen) == len(expected):
            first = next((i for i, (s, e) in enumerate(zip(seen, expected, strict=True)) if s != e), 0)
            start = max(first - 2, 0) if len(_short(seen, 10**6)) > limit else 0
            out.append((name, _window(seen, start, limit), _window(expected, start, limit)))
        else:
            out.append((name, _short(seen, limit), _short(expected, limit)))
    return out


def _difference_lines(difference: dict[str, Any]) -> list[str]:
    """One line per part that differs, or three where it is long: the field, then seen and expected."""
    lines = []
    for name, seen, expected in _differing_parts(difference, WIDE):
        line = f"  rank {difference['rank']}: {name} = {seen}  (expected {expected})"
        if len(line) <= WIDE:
            lines.append(line)
        else:
            lines += [
                f"  rank {difference['rank']}, {name}:",
                f"      seen:     {seen}",
                f"      expected: {expected}",
            ]
    return lines


def _rank_lines(seen: list[dict[str, Any]]) -> list[str]:
    """What each rank did: a line per rank, or a line per field of every rank where one would be too long."""
    lines = [
        f"  rank {r}: " + ", ".join(f"{k}={_short(v)}" for k, v in s.items()) for r, s in enumerate(seen)
    ]
    if all(len(line) <= WIDE for line in lines):
        return lines
    return [
        line
        for r, s in enumerate(seen)
        for line in [f"  rank {r}:"] + [f"      {k} = {_short(v, WIDE)}" for k, v in s.items()]
    ]


def _rounded(value: Any) -> Any:
    return _floats(value, lambda x: float(f"{x:.6g}"))
