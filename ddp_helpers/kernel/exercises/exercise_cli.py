"""``python -m ddp_helpers exercises``: list, show a solution, check an answer file or a capstone script."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ddp_helpers.errors import InvalidLaunchArguments
from ddp_helpers.rank.registry import UnknownExercise, catalogue, get, solution

MAX_NPROC = 8


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("exercises", help="list the exercises, show a solution, check an answer")
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="every exercise, with its notebook and title")
    actions.add_parser("solution", help="the reference answer of one exercise").add_argument("id")
    check = actions.add_parser("check", help="run FILE's code as the answer on live ranks, and judge it")
    check.add_argument("id")
    check.add_argument("file")
    check.add_argument("--nproc", type=int, default=2, help="ranks to check on (1 to 8; default 2)")
    script = actions.add_parser("check-script", help="check a whole capstone script under torchrun")
    script.add_argument("script")
    nproc_help = (
        "check at N ranks, with --amp fp16 then --amp bf16 (default: 2 ranks with fp16, then 3 with bf16)"
    )
    script.add_argument("--nproc", type=int, default=None, metavar="N", help=nproc_help)
    for action in (listing, check, script):
        action.add_argument("--json", action="store_true")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "list":
            return _list(args.json)
        if args.action == "solution":
            print(solution(args.id), end="")
            return 0
        if args.action == "check":
            return _check(args)
        return _check_script(args)
    except (UnknownExercise, InvalidLaunchArguments) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _list(as_json: bool) -> int:
    rows = catalogue()
    if as_json:
        print(json.dumps(rows))
    else:
        for row in rows:
            print(f"{row['id']:<22} {row['notebook']}  {row['title']}")
    return 0


def _nproc(value: int | None) -> None:
    if value is not None and not 1 <= value <= MAX_NPROC:
        raise InvalidLaunchArguments(f"--nproc must be 1 to {MAX_NPROC}, got {value}")


def _read(path: str) -> str:
    file = Path(path)
    if not file.is_file():
        raise InvalidLaunchArguments(f"no such file: {path}")
    return file.read_text()


def answer_of(text: str, exercise_id: str) -> str:
    """The answer in FILE, without the `%%exercise ID` line of a cell pasted whole (refused if ID differs)."""
    first, _, rest = text.lstrip("\n").partition("\n")
    if not first.startswith("%%exercise"):
        return text
    named = first.split()[1:]
    if named and named[0] != exercise_id:
        raise InvalidLaunchArguments(f"the file is the answer cell of {named[0]}, not of {exercise_id}")
    return rest


def _check(args: argparse.Namespace) -> int:
    from ddp_helpers.kernel.exercises.checker import check, precheck

    exercise = get(args.id)
    _nproc(args.nproc)
    code = answer_of(_read(args.file), exercise.id)
    # refused or said at once, before torch or a rank: bad input, or an answer not written yet
    verdict = precheck(exercise, code, args.nproc)
    if verdict is None:
        from ddp_helpers.kernel.live.ranks import start_ranks

        with start_ranks(nproc=args.nproc, show_ranks="none" if args.json else "all") as ranks:
            verdict = check(exercise.id, code, ranks)
    print(verdict.to_json() if args.json else verdict.text())
    return 0 if verdict.passed else 1


def _check_script(args: argparse.Namespace) -> int:
    _nproc(args.nproc)
    try:
        compile(_read(args.script), args.script, "exec")
    except SyntaxError as error:
        raise InvalidLaunchArguments(
            f"{args.script}: syntax error at line {error.lineno}: {error.msg}"
        ) from None
    from ddp_helpers.chapters.ch10_capstone.ch10_exercises import check_script

    nproc = (2, 3) if args.nproc is None else (args.nproc,)
    verdict = check_script(Path(args.script), nproc=nproc, progress=not args.json)
    print(verdict.to_json() if args.json else verdict.text())
    return 0 if verdict.passed else 1
