"""Command line: ``python -m ddp_helpers doctor``, ``python -m ddp_helpers launch SCRIPT [ARGS...]`` and
``python -m ddp_helpers exercises ...`` (list, solution, check, check-script)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from ddp_helpers.kernel.launcher.options import add_flags


def _doctor(args: argparse.Namespace) -> int:
    from ddp_helpers.chapters.ch00_environment.ch00_allreduce_check import live_allreduce
    from ddp_helpers.kernel.lab.doctor import collect_facts, exit_code, format_checks, run_checks

    facts = collect_facts()
    checks = run_checks(facts)
    summary: dict[str, Any] = {}
    if not args.no_live:
        print("running a live all_reduce check through torchrun...", file=sys.stderr)
        live, summary = live_allreduce(nproc=args.nproc, max_bytes=args.max_bytes, progress="off")
        checks += live
    if args.json:
        from dataclasses import asdict

        print(
            json.dumps(
                {"facts": facts, "checks": [asdict(c) for c in checks], "allreduce": summary}, indent=2
            )
        )
    else:
        print(format_checks(checks))
    return exit_code(checks)


def _launch(args: argparse.Namespace) -> int:
    from ddp_helpers.errors import LaunchError, LaunchInterrupted
    from ddp_helpers.kernel.launcher.options import OPTIONS, given_options
    from ddp_helpers.kernel.launcher.runner import launch

    options = given_options(args)
    ours = sorted({a.split("=")[0] for a in args.script_args} & {o.flag for o in OPTIONS})
    if ours:
        print(
            f"note: {', '.join(ours)} after the script go to the script; launch options go before it",
            file=sys.stderr,
        )
    stopped_by = _stop_cleanly_on_signals()
    try:
        result = launch(args.script, *args.script_args, **options)
    except LaunchInterrupted as err:
        signum = stopped_by[-1] if stopped_by else signal.SIGINT
        print(f"{type(err).__name__}: {signal.Signals(signum).name}: {err}", file=sys.stderr)
        return 128 + signum  # what a shell reports for a job that a signal stopped
    except LaunchError as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(f"finished in {result.wall_s:.1f}s; run dir {result.run_dir}")
    return 0


def _stop_cleanly_on_signals() -> list[int]:
    """Make SIGTERM and SIGHUP (a scheduler's cancel, a closed terminal) stop the run as Ctrl-C does.

    Returns the list that each such signal is appended to, so the exit status can name it.
    """
    received: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt  # launch() stops every process of the run, then raises LaunchInterrupted

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, interrupt)
    return received


def build_parser() -> argparse.ArgumentParser:
    """``doctor``, ``launch`` and ``exercises``; launch's flags are built from the declared launcher options."""
    parser = argparse.ArgumentParser(prog="python -m ddp_helpers")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="check this machine for DDP (exit 1 only when a check FAILs)")
    doctor.add_argument("--no-live", action="store_true", help="skip the multi-process all_reduce check")
    doctor.add_argument("--nproc", type=int, default=None)
    doctor.add_argument("--max-bytes", type=int, default=1 << 24)
    doctor.add_argument("--json", action="store_true", help="print facts and checks as JSON")
    doctor.set_defaults(func=_doctor)
    run = sub.add_parser(
        "launch",
        help="run a script under torchrun with live per-rank output",
        description="Options go before SCRIPT: everything after SCRIPT is the script's own arguments "
        "(python -m ddp_helpers launch --nproc 2 train.py --steps 5). Unset options keep launch()'s defaults.",
    )
    add_flags(run)  # one per declared option, each defaulting to None: launch()'s own defaults apply
    run.add_argument("script")
    script_args = run.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    script_args.required = False  # a script may take none: the usage error must not ask for them
    run.set_defaults(func=_launch)
    from ddp_helpers.kernel.exercises.exercise_cli import add_parser as add_exercises

    add_exercises(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
