"""Exercises: the learner writes a lesson's key lines, the workbench runs them on live ranks and names the mistake.

    from ddp_helpers.kernel.exercises.checker import check
    verdict = check("01-shard", answer_code, ranks)   # ranks: a LiveRanks

In a notebook, ``%%exercise 01-shard`` checks the cell's code; ``%exercise solution 01-shard`` shows
the reference answer. The modules: `spec` (what an exercise is), `registry` (every exercise, by id),
`nb01` ... `nb09` (each notebook's, a package where it has a file per exercise), `observers` and `rank_side` (on the ranks), `checker` and
`verdict` (in the kernel), `magics` and `cli`, and `capstone` (notebook 10's whole-script check).
This package's top loads only what the ranks load too.
"""

from __future__ import annotations

from ddp_helpers.rank.registry import UnknownExercise, all_exercises, get
from ddp_helpers.rank.spec import Exercise, Mistake

__all__ = ["Exercise", "Mistake", "UnknownExercise", "all_exercises", "get"]
