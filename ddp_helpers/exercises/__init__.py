"""Exercises: the learner writes a lesson's key lines, the workbench runs them on live ranks and names the mistake.

    from ddp_helpers.exercises import check, all_exercises
    verdict = check("01-shard", answer_code, ranks)   # ranks: a LiveRanks

In a notebook, ``%%exercise 01-shard`` checks the cell's code; ``%exercise solution 01-shard`` shows
the reference answer. The modules: `spec` (what an exercise is), `registry` (every exercise, by id),
`nb01` ... `nb09` (each notebook's), `observers` and `rank_side` (on the ranks), `checker` and
`verdict` (in the kernel), `magics` and `cli`, and `capstone` (notebook 10's whole-script check).
"""

from __future__ import annotations

from .registry import UnknownExercise, all_exercises, get
from .spec import Exercise, Mistake

__all__ = ["Exercise", "Mistake", "UnknownExercise", "all_exercises", "check", "get"]


def check(exercise_id, code, ranks, workdir=None, timeout=None):  # noqa: ANN001, ANN201: see checker.check
    """See `checker.check`: loaded on first use, so the ranks' side never imports the kernel's."""
    from .checker import check as run_check

    return run_check(exercise_id, code, ranks, workdir, timeout)
