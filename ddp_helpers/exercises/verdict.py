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
            lines += [
                f"  rank {d['rank']}: {d['field']} = {_short(d['seen'])}  (expected {_short(d['expected'])})"
                for d in self.differences[:12]
            ]
        if self.seen and not self.passed:
            lines.append("what each rank did:")
            lines += [f"  rank {r}: " + ", ".join(f"{k}={_short(v)}" for k, v in s.items()) for r, s in
                      enumerate(self.seen)]  # fmt: skip
        if not self.passed and self.hint:
            lines.append(f"hint: {self.hint}")
            lines.append(f"the solution, when you want it: %exercise solution {self.exercise}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.passed else "#6e7781" if self.diagnosis == UNWRITTEN else "#cf222e"
        title = (
            "passed"
            if self.passed
            else self.diagnosis
            if self.diagnosis == UNWRITTEN
            else f"not yet: {self.diagnosis}"
        )
        parts = [
            f'<div style="border-left:4px solid {colour};padding:4px 10px">',
            f"<b>{html.escape(self.exercise)}: {html.escape(title)}</b>"
            + (f" ({self.world_size} rank(s))" if self.world_size else ""),
            f"<p>{html.escape(self.message)}</p>",
        ]
        if not self.passed and self.seen:
            names = list(dict.fromkeys(k for s in self.seen for k in s))
            wanted = {(d["rank"], d["field"]) for d in self.differences}
            rows = "".join(
                "<tr><td>"
                + str(r)
                + "</td>"
                + "".join(
                    f"<td{' style=color:#cf222e' if (r, k) in wanted else ''}>{html.escape(_short(s.get(k, '')))}</td>"
                    for k in names
                )
                + "</tr>"
                for r, s in enumerate(self.seen)
            )
            header = "".join(f"<th>{html.escape(k)}</th>" for k in names)
            parts.append(f"<table><tr><th>rank</th>{header}</tr>{rows}</table>")
        if self.differences:
            items = "".join(
                f"<li>rank {d['rank']}: {html.escape(d['field'])} = {html.escape(_short(d['seen']))}, "
                f"expected {html.escape(_short(d['expected']))}</li>"
                for d in self.differences[:12]
            )
            parts.append(f"<p>What differs from a right answer:</p><ul>{items}</ul>")
        if not self.passed and self.hint:
            parts.append(f"<p><i>Hint:</i> {html.escape(self.hint)}</p>")
            parts.append(
                f"<p>The solution, when you want it: <code>%exercise solution {html.escape(self.exercise)}</code></p>"
            )
        parts.append("</div>")
        return "".join(parts)

    def __str__(self) -> str:
        return self.text()

    __repr__ = __str__  # what a terminal, papermill's text output and a log show


def _json_safe(value: Any) -> Any:
    """NaN and the infinities as the strings "nan", "inf" and "-inf": JSON has no such numbers (json.dumps
    would write NaN, which strict readers refuse, and some writers turn it into null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(float(value))
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(_rounded(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value
