"""The shape of a lesson, measured: is each notebook a lesson a newcomer finishes in under an hour?

    python scripts/lesson_shape.py            # a table of every lesson in notebooks/
    python scripts/lesson_shape.py 01 04      # only these

For each notebook: the words of prose (markdown, and the comments in code cells), the bare `assert`
statements, the lines of the parameters cell and the setup cell after it, the exercises (`%%exercise`
cells) and where each stands in the prose (the share of the prose read before it), the longest stretch of
prose without an exercise, and for each exercise the share of its reference answer's lines that stand
verbatim in a code cell above it. tests/test_lesson_shape.py holds the lessons to the limits below.
"""

from __future__ import annotations

import ast
import io
import json
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_PROSE_WORDS = 1500
MAX_SETUP_LINES = 16  # the parameters cell and the one setup cell after it, blank lines not counted
FIRST_EXERCISE_BY = 0.25  # the first exercise within the first quarter of the prose
MAX_STRETCH = 0.40  # no stretch of more than 40 % of the prose without an exercise
MAX_VERBATIM = 0.25  # at most a quarter of an answer's lines stand verbatim above its exercise
MIN_EXERCISES = 2

_MAGIC_LINE = re.compile(r"(?m)^(\s*)[%!].*$")


def _python_of(source: str) -> str:
    """A code cell as Python: magic and shell lines become `pass` (a %%exercise cell's body is Python)."""
    return _MAGIC_LINE.sub(r"\1pass", source)


def comment_words(source: str) -> int:
    """Words in the comments of one code cell (tokenised, so a '#' inside a string is no comment)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(_python_of(source)).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return sum(len(line.split("#", 1)[1].split()) for line in source.splitlines() if "#" in line)
    return sum(len(t.string.lstrip("#").split()) for t in tokens if t.type == tokenize.COMMENT)


def bare_asserts(source: str) -> int:
    try:
        tree = ast.parse(_python_of(source))
    except SyntaxError:
        return len(re.findall(r"(?m)^\s*assert\b", source))
    return sum(isinstance(node, ast.Assert) for node in ast.walk(tree))


def _code_lines(source: str) -> set[str]:
    """A cell's lines as compared for verbatim copies: comments and surrounding space dropped."""
    lines = set()
    for line in source.splitlines():
        text = line.split("  #", 1)[0].strip()
        if text and not text.startswith(("#", "%")):
            lines.add(text)
    return lines


@dataclass
class Exercise:
    id: str
    cell: int
    at: float  # the share of the prose read before it
    verbatim: float | None = None  # the share of its answer's lines that stand above it (None: not measured)


@dataclass
class Shape:
    notebook: str
    prose_words: int = 0
    asserts: int = 0
    setup_lines: int = 0
    exercises: list[Exercise] = field(default_factory=list)
    longest_stretch: float = 1.0

    def problems(self, needs_exercises: bool = True) -> list[str]:
        """What keeps this notebook from being a lesson, in words; empty when it is one."""
        found = []
        if self.prose_words > MAX_PROSE_WORDS:
            found.append(f"{self.prose_words} words of prose (at most {MAX_PROSE_WORDS})")
        if self.asserts:
            found.append(f"{self.asserts} bare assert statements (use check())")
        if self.setup_lines > MAX_SETUP_LINES:
            found.append(f"{self.setup_lines} lines of parameters and setup (at most {MAX_SETUP_LINES})")
        if not needs_exercises:
            return found
        if len(self.exercises) < MIN_EXERCISES:
            found.append(f"{len(self.exercises)} exercises (at least {MIN_EXERCISES})")
        if self.exercises and self.exercises[0].at > FIRST_EXERCISE_BY:
            found.append(
                f"the first exercise after {self.exercises[0].at:.0%} of the prose (by {FIRST_EXERCISE_BY:.0%})"
            )
        if self.longest_stretch > MAX_STRETCH:
            found.append(
                f"{self.longest_stretch:.0%} of the prose without an exercise (at most {MAX_STRETCH:.0%})"
            )
        for e in self.exercises:
            if e.verbatim is not None and e.verbatim > MAX_VERBATIM:
                found.append(
                    f"{e.id}: {e.verbatim:.0%} of its answer stands verbatim above it (at most {MAX_VERBATIM:.0%})"
                )
        return found


def _reference_of(exercise_id: str) -> str | None:
    try:
        from ddp_helpers.rank.registry import get
    except ImportError:
        return None
    try:
        return get(exercise_id).reference
    except KeyError:
        return None


def measure(path: Path) -> Shape:
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    shape = Shape(path.stem)
    words_before: list[int] = []  # prose words before each cell
    total = 0
    for cell in cells:
        words_before.append(total)
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            total += len(source.split())
        elif cell["cell_type"] == "code":
            total += comment_words(source)
            shape.asserts += bare_asserts(source)
    shape.prose_words = total
    code = [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    tagged = [
        n for n, (i, _) in enumerate(code) if "parameters" in cells[i].get("metadata", {}).get("tags", [])
    ]
    if tagged:
        setup = code[tagged[0] : tagged[0] + 2]
        shape.setup_lines = sum(1 for _, src in setup for line in src.splitlines() if line.strip())
    for i, source in code:
        first = source.lstrip().split("\n", 1)[0]
        if not first.startswith("%%exercise"):
            continue
        exercise_id = first.split()[1] if len(first.split()) > 1 else "?"
        at = words_before[i] / total if total else 0.0
        entry = Exercise(exercise_id, i, at)
        reference = _reference_of(exercise_id)
        if reference is not None:
            answer = _code_lines(reference)
            above = set().union(*(_code_lines(src) for j, src in code if j < i)) if i else set()
            entry.verbatim = len(answer & above) / len(answer) if answer else 0.0
        shape.exercises.append(entry)
    marks = [0.0, *(e.at for e in shape.exercises), 1.0]
    shape.longest_stretch = max(b - a for a, b in zip(marks[:-1], marks[1:], strict=True))
    return shape


def lessons(root: Path = ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def main(argv: list[str]) -> int:
    chosen = [p for p in lessons() if not argv or p.stem[:2] in argv]
    print(
        "| notebook | prose words | asserts | setup lines | exercises (where) | longest stretch | problems |"
    )
    print("|---|---:|---:|---:|---|---:|---|")
    for path in chosen:
        s = measure(path)
        where = ", ".join(
            f"{e.id} {e.at:.0%}" + (f" ({e.verbatim:.0%} above)" if e.verbatim is not None else "")
            for e in s.exercises
        )
        problems = "; ".join(s.problems(needs_exercises=s.notebook[:2] != "10")) or "none"
        print(
            f"| {s.notebook} | {s.prose_words} | {s.asserts} | {s.setup_lines} | {where} | {s.longest_stretch:.0%} | {problems} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
