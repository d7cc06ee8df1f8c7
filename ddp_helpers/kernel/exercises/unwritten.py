"""An answer not written yet (the starter, an empty cell, a ``...`` placeholder) is not a wrong answer:
name the open TODOs and run nothing, rather than let Python's Ellipsis fail on the ranks."""

from __future__ import annotations

import ast
import re

from ddp_helpers.rank.spec import Exercise

_TODO = re.compile(r"#\s*TODO\s*(\d+)?:?\s*(.*)$")  # "# TODO: ..." or a numbered "# TODO 3: ..."


def _placeholder_lines(code: str) -> list[int]:
    """The lines holding a ``...`` that stands for code, not one inside a subscript (``x[..., 0]``)."""
    tree = ast.parse(code)
    in_subscript = {
        id(node) for sub in ast.walk(tree) if isinstance(sub, ast.Subscript) for node in ast.walk(sub.slice)
    }
    return sorted(
        {
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value is Ellipsis and id(node) not in in_subscript
        }
    )


def _normalised(code: str) -> list[str]:
    return [line.rstrip() for line in code.strip().splitlines() if line.strip()]


def _has_code(code: str) -> bool:
    """Anything but comments, blank lines and bare constants (a docstring, a lone ``...``)."""
    for node in ast.parse(code).body:
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            return True
    return False


def open_todos(code: str) -> list[str]:
    """Each placeholder still in `code`, in words: "line 1: a DistributedSampler over `dataset`"."""
    lines = code.splitlines()
    found = []
    for number in _placeholder_lines(code):
        text = lines[number - 1]
        todo = _TODO.search(text)
        where = f"line {number}" + (f" (TODO {todo.group(1)})" if todo and todo.group(1) else "")
        found.append(
            f"{where}: " + (todo.group(2).strip() if todo and todo.group(2).strip() else text.strip())
        )
    return found


def unwritten_message(exercise: Exercise, code: str) -> str | None:
    """Why this answer is not written yet, or None when it is written (right or wrong, the ranks judge it)."""
    if not _has_code(code):
        return f"the cell holds no code yet. The task: {exercise.task}"
    todos = open_todos(code)
    if _normalised(code) == _normalised(exercise.starter):
        listed = "; ".join(todos) if todos else "the lines its comments ask for"
        return f"this is the starter as given: write {listed}."
    if todos:
        return "`...` still stands where your code goes: " + "; ".join(todos) + "."
    return None
