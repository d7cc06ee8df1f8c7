"""Exercises: the learner writes a lesson's key lines, the workbench runs them on live ranks and names the mistake.

    from ddp_helpers.kernel.exercises.checker import check
    verdict = check("01-shard", answer_code, ranks)   # ranks: a LiveRanks

In a notebook, ``%%exercise 01-shard`` checks the cell's code; ``%exercise solution 01-shard`` shows
the reference answer. What an exercise is (`rank.spec`) and the catalogue (`rank.registry`) load in the
ranks too; each chapter's exercises are in its folder (chapters/chNN_*/chNN_exercises.py).
"""

from __future__ import annotations

from ddp_helpers.rank.registry import UnknownExercise, all_exercises, get
from ddp_helpers.rank.spec import Exercise, Mistake

__all__ = ["Exercise", "Mistake", "UnknownExercise", "all_exercises", "get"]
