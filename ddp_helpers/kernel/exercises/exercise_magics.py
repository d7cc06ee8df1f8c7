"""``%%exercise ID`` and ``%exercise``: the learner's answer checked on the live ranks, in a notebook cell."""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from ddp_helpers.errors import InvalidLaunchArguments
from ddp_helpers.kernel.exercises.verdict import Verdict
from ddp_helpers.rank.registry import CAPSTONE, CAPSTONE_TITLE, catalogue, get, solution

_use_reference = False


class ExerciseFailed(AssertionError):
    """A reference answer failed its own check (only in reference mode: a broken lesson, or a mutant)."""


def _ranks() -> Any:
    from ddp_helpers.kernel.live import live_magics as live

    if live._current is not None and live._current.alive:
        return live._current
    from ddp_helpers.kernel.live.ranks import start_ranks

    print("no live ranks are running: starting them for the exercise (%ranks start does the same)")
    live._current = start_ranks()
    return live._current


@magics_class
class ExerciseMagics(Magics):
    @line_cell_magic
    def exercise(self, line: str, cell: str | None = None) -> Any:
        """Check an answer on the live ranks (cell form), or: hint, solution, list, reference on|off.

        Reference mode (headless runs): each cell checks the reference answer instead, and a failure raises."""
        global _use_reference
        words = shlex.split(line)
        if cell is not None:
            if len(words) != 1:
                raise InvalidLaunchArguments(
                    f"%%exercise takes one exercise id, e.g. %%exercise 01-shard; got {line!r}"
                )
            return self._check(words[0], cell)
        action, rest = (words[0], words[1:]) if words else ("", [])
        if action == "list":
            import pandas as pd

            return pd.DataFrame(catalogue()).drop(columns="covers").set_index("id")
        if action == "solution" and len(rest) == 1:
            title = CAPSTONE_TITLE if rest[0] == CAPSTONE else get(rest[0]).title
            print(f"# the reference answer to {rest[0]}: {title}\n{solution(rest[0])}")
            return None
        if action == "hint" and len(rest) == 1:
            print(get(rest[0]).hint)
            return None
        if action == "reference" and rest in (["on"], ["off"]):
            _use_reference = rest[0] == "on"
            return None
        raise InvalidLaunchArguments(
            f"%exercise takes list, hint ID, solution ID or reference on|off; got {line!r}"
        )

    def _check(self, exercise_id: str, cell: str) -> None:
        from ddp_helpers.kernel.exercises.checker import check

        exercise = get(exercise_id)  # an unknown id is refused before any rank starts
        code = exercise.reference if _use_reference else cell
        if _use_reference:
            print(f"checking the reference answer to {exercise.id} (reference mode: your cell is not run)")
        verdict: Verdict = check(exercise.id, code, _ranks())
        assert self.shell is not None
        self.shell.user_ns["_exercise_verdict"] = verdict
        display(verdict)
        if _use_reference and not verdict.passed:
            raise ExerciseFailed(
                f"the reference answer to {exercise.id} failed: {verdict.diagnosis}: {verdict.message}"
            )
