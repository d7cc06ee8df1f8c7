"""Command line: ``python -m ddp_helpers doctor`` and ``python -m ddp_helpers exercises ...``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any


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
        report = {"facts": facts, "checks": [asdict(c) for c in checks], "allreduce": summary}
        print(json.dumps(report, indent=2))
    else:
        print(format_checks(checks))
    return exit_code(checks)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ddp_helpers")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="check this machine for DDP (exit 1 only when a check FAILs)")
    doctor.add_argument("--no-live", action="store_true", help="skip the multi-process all_reduce check")
    doctor.add_argument("--nproc", type=int, default=None)
    doctor.add_argument("--max-bytes", type=int, default=1 << 24)
    doctor.add_argument("--json", action="store_true", help="print facts and checks as JSON")
    doctor.set_defaults(func=_doctor)
    from ddp_helpers.kernel.exercises.exercise_cli import add_parser as add_exercises

    add_exercises(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
