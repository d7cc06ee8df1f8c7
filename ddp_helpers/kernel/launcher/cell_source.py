"""A cell magic's body, numbered as the learner's editor numbers it, and its syntax errors shown plainly.

A cell magic receives the cell without its first line (``%%ranks ...``), so the compiler would call
the editor's line 2 "line 1". `as_in_editor` puts an empty line in the magic's place: syntax errors
and tracebacks then use the editor's numbers.
"""

from __future__ import annotations

import traceback


def as_in_editor(body: str) -> str:
    """The cell's code with the magic's line kept as an empty line, so line numbers match the editor."""
    return "\n" + body


class CellSyntaxError(Exception):
    """A cell that does not compile: shown as Python shows a SyntaxError, without the magic's frames.

    (IPython prints a SyntaxError raised inside a magic with the magic's whole call stack.)
    """

    def __init__(self, error: SyntaxError) -> None:
        self.error = error
        super().__init__(str(error))

    def _render_traceback_(self) -> list[str]:
        return "".join(traceback.format_exception_only(type(self.error), self.error)).rstrip().splitlines()
