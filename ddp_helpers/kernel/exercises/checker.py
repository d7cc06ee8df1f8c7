"""Kernel side: run an answer on live ranks (in a fresh namespace, `rank/answer_runner.py`), then judge
it: "passed" only when every rank's observations equal the expected ones; else the first catalogued
mistake whose signature matches, an exception, or the fields that differ."""

from __future__ import annotations

import ast
import itertools
import os
import re
import time
from pathlib import Path
from typing import Any

from ddp_helpers.errors import InvalidLaunchArguments, LaunchTimeout, RankError, WorkerFailed
from ddp_helpers.kernel.exercises.verdict import HUNG, PASSED, RAISED, UNKNOWN, UNWRITTEN, Verdict
from ddp_helpers.rank import stack_dumps
from ddp_helpers.rank.registry import get
from ddp_helpers.rank.spec import Exercise, differences

_checks = itertools.count()
_TODO = re.compile(r"#\s*TODO\s*(\d+)?:?\s*(.*)$")  # "# TODO: ..." or a numbered "# TODO 3: ..."
ONE_SIDED_HINT = (
    "Every rank must make each collective call, in the same order: take the call out of the block that "
    "only some ranks enter (an `if rank == 0:` block holds what one rank does alone), so all reach it."
)


def open_todos(code: str) -> list[str]:
    """Each ``...`` still standing for code (not one in a subscript, ``x[..., 0]``), in words."""
    tree = ast.parse(code)
    in_subscript = {
        id(n) for sub in ast.walk(tree) if isinstance(sub, ast.Subscript) for n in ast.walk(sub.slice)
    }
    numbers = sorted(
        {
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value is Ellipsis and id(node) not in in_subscript
        }
    )
    found = []
    for number in numbers:
        text = code.splitlines()[number - 1]
        todo = _TODO.search(text)
        where = f"line {number}" + (f" (TODO {todo[1]})" if todo and todo[1] else "")
        found.append(f"{where}: " + (todo[2].strip() if todo and todo[2].strip() else text.strip()))
    return found


def unwritten_message(exercise: Exercise, code: str) -> str | None:
    """Why this answer is not written yet (the starter, an empty cell, a ``...``), or None: the ranks judge it."""
    if all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in ast.parse(code).body):
        return f"the cell holds no code yet. The task: {exercise.task}"
    todos = open_todos(code)

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines() if line.strip()]

    if lines(code) == lines(exercise.starter):
        return f"this is the starter as given: write {'; '.join(todos) or 'the lines its comments ask for'}."
    if todos:
        return "`...` still stands where your code goes: " + "; ".join(todos) + "."
    return None


def precheck(exercise: Exercise, code: Any, world: int) -> Verdict | None:
    """Refuse a non-string or a syntax error; the verdict on an answer not written yet (nothing runs)."""
    if not isinstance(code, str):
        raise InvalidLaunchArguments(f"an answer is code in a string, got {type(code).__name__}")
    try:
        compile(code, "<your answer>", "exec")
    except SyntaxError as error:
        raise InvalidLaunchArguments(
            f"{exercise.id}: your answer has a syntax error at line {error.lineno}: {error.msg}"
        ) from None
    unwritten = unwritten_message(exercise, code)
    return None if unwritten is None else Verdict(exercise.id, False, UNWRITTEN, unwritten, "", world)


def check(
    exercise_id: str,
    code: str,
    ranks: Any,
    workdir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
) -> Verdict:
    """Run `code` as the answer to `exercise_id` on `ranks` (a `LiveRanks`) and judge what it did."""
    exercise = get(exercise_id)
    world = ranks.world_size
    early = precheck(exercise, code, world)
    if early is not None:  # nothing to run: the ranks are not touched
        return early
    base = Path(workdir) if workdir is not None else Path("runs") / "exercises"
    folder = (base / f"{exercise.id}-{os.getpid()}-{next(_checks)}-{time.time_ns() % 10**6}").resolve()
    call = (
        "import ddp_helpers.rank.answer_runner as _exercise\n"
        f"_exercise.run({exercise.id!r}, {code!r}, {str(folder)!r});"
    )
    bound = exercise.timeout_s if timeout is None else timeout

    def failed(diagnosis: str, message: str, hint: str, restarted: bool) -> Verdict:
        return Verdict(exercise.id, False, diagnosis, message, hint, world, ranks_restarted=restarted)

    try:
        ranks.run(call, timeout=bound)
    except LaunchTimeout as error:
        restarted = _restart(ranks)
        named = one_sided_collective(error, world)
        head = named or (
            f"your answer did not finish within {bound:g}s on every rank: most often one rank "
            "calls a collective that another never reaches."
        )
        message = f"{head}\n{error}" + ("\nThe ranks were restarted for your next try." if restarted else "")
        return failed(HUNG, message, ONE_SIDED_HINT if named else exercise.hint, restarted)
    except WorkerFailed as error:
        restarted = _restart(ranks)
        mismatched = collective_mismatch(str(error))
        message = f"{mismatched}\n" if mismatched else ""
        message += f"a rank died while running your answer: {error}"
        return failed(RAISED, message, ONE_SIDED_HINT if mismatched else exercise.hint, restarted)
    except RankError as error:  # the answer raised on some rank: what each rank kept says more
        if not ranks.alive or "was still in the cell" in error.args[0]:  # the others waited for it
            message = (
                "your answer raised on some rank while the others still ran it, waiting for that rank (most "
                f"often in a collective it never reached):\n{error}"
            )
            restarted = "Fresh ranks were started" in str(error) or _restart(ranks)
            return failed(RAISED, message, exercise.hint, restarted)
    kept = ranks.run("_exercise.LAST")  # {rank: result}, in the order the replies came
    results = [kept[rank] for rank in sorted(kept)]
    if any(r is None for r in results):
        raise RuntimeError(f"the checker found no result of {exercise.id} on some rank: {results}")
    return judge(exercise, results)


def judge(exercise: Exercise, results: list[dict[str, Any]]) -> Verdict:
    """The verdict on what each rank's run of the answer reported (`answer_runner.run`)."""
    world = len(results)
    expected = exercise.expected(world)
    fields = list(dict.fromkeys(k for e in expected for k in e))
    seen = [{k: r[k] for k in fields if k in r} for r in results]
    errors = {r["rank"]: r["error"] for r in results if r.get("error")}
    found = differences(results, expected, exercise.tolerance)
    diffs = [{"rank": r, "field": f, "seen": s, "expected": e} for r, f, s, e in found]
    if not errors and not found:
        return Verdict(
            exercise.id, True, PASSED, _passed_message(exercise, results), "", world, seen, expected
        )
    for mistake in exercise.mistakes:
        try:
            matched = mistake.matches(results, expected)
        except Exception:  # a signature that cannot read this answer's results does not match it
            matched = False
        if matched:
            hint = mistake.hint or exercise.hint
            return Verdict(
                exercise.id, False, mistake.id, mistake.message, hint, world, seen, expected, diffs
            )
    if errors:
        listed = "; ".join(f"rank {r}: {e}" for r, e in sorted(errors.items()))
        others = " and others" if len(errors) > 1 else ""
        message = f"your answer raised on rank {min(errors)}{others}: {listed}"
        return Verdict(exercise.id, False, RAISED, message, exercise.hint, world, seen, expected)
    message = (
        "this answer is wrong in a way the checker has no name for: "
        f"{len(diffs)} value(s) differ from what a right answer gives (below)"
    )
    return Verdict(exercise.id, False, UNKNOWN, message, exercise.hint, world, seen, expected, diffs)


def _passed_message(exercise: Exercise, results: list[dict[str, Any]]) -> str:
    """Passed; with the notes a rank's `observe` left (right but costly, or harmless but unneeded), once each."""
    message = f"{exercise.title}: every rank did what a right answer does, on {len(results)} rank(s)"
    nodes = {(r.get("node layout") or {}).get("GROUP_RANK") for r in results}
    if len(nodes) > 1 and None not in nodes:  # the answer ran as ranks of pretend nodes (Exercise.nodes)
        message += f", run as {len(nodes)} nodes (where LOCAL_RANK is not RANK)"
    notes = dict.fromkeys(note for r in results for note in r.get("notes") or ())
    return message + "." + (" Note: " + "; ".join(notes) + "." if notes else "")


def waits_in_answer(stack: str) -> tuple[str, int] | None:
    """(the collective, the answer's line) where a stuck rank waits, from its stack (innermost first)."""
    frames = list(stack_dumps.FRAME.finditer(stack))
    names = [f"`{f['func']}`" for f in frames if f["file"].endswith("distributed_c10d.py")]
    # DDP's all-reduce runs in autograd's engine
    if not names and any(f["func"] == "backward" for f in frames):
        names = ["`backward()` (DDP's all-reduce of the gradients)"]
    for frame in frames:
        if frame["file"] == "<your answer>":
            return (names[0] if names else "a call", int(frame["line"]))
    return None


def one_sided_collective(error: LaunchTimeout, world: int) -> str | None:
    """The hang named, where some ranks finished the answer and every stuck one waits in a collective of it."""
    stuck = sorted(set(error.silent_ranks))
    finished = [r for r in range(world) if r not in stuck]
    waits = {r: w for r in stuck if (w := waits_in_answer(error.stacks.get(r, ""))) is not None}
    if not stuck or not finished or len(waits) < len(stuck):
        return None
    where = "; ".join(f"rank {r} waits in {c} at line {n} of your answer" for r, (c, n) in waits.items())
    return (
        f"a collective only some ranks call: {where}, which rank(s) {', '.join(map(str, finished))} never "
        "called: they finished the cell. A collective inside a block that only some ranks enter waits for "
        "the others forever."
    )


def collective_mismatch(error: str) -> str | None:
    """The death named, where gloo aborted a rank because the ranks' collectives did not match."""
    if "collective mismatch" not in error and "doesn't match expected size" not in error:
        return None
    return (
        "the ranks' collectives did not match: gloo stopped a rank that received another size than it "
        "expected, because one rank skipped a collective the others made (a `backward()`, whose gradients "
        "DDP all-reduces, counts as one) and its next call met theirs."
    )


def _restart(ranks: Any) -> bool:
    if ranks.alive:
        return False
    ranks.restart()
    return True
