"""A notebook run again in the same folder with other parameters, as a learner does: does it still pass?

    python benchmarks/notebook_reruns.py [--sequence smoke:2,full:2,smoke:3] [notebooks ...]

Each notebook gets one folder (its runs/, checkpoints and workers stay there between its runs) and runs the
sequence in it: by default smoke mode at nproc 2, then full size, then smoke mode at nproc 3. Prints a
Markdown table of each run's result and wall time, and keeps every executed notebook under
``runs/notebook-reruns/<notebook>/`` for reading. Exit code 1 if any run failed. It takes long (full size
is every notebook as a learner runs it); `make test-shapes` checks a short rerun of each in CI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import papermill

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OUT = REPO / "runs" / "notebook-reruns"


def parse_sequence(text: str) -> list[tuple[str, int]]:
    """'smoke:2,full:3' -> [('smoke', 2), ('full', 3)]; a bad step is refused with what was wrong."""
    steps = []
    for step in text.split(","):
        mode, _, nproc = step.partition(":")
        if mode not in ("smoke", "full") or not nproc.isdigit() or int(nproc) < 1:
            raise argparse.ArgumentTypeError(f"{step!r}: each step is smoke:N or full:N, N >= 1")
        steps.append((mode, int(nproc)))
    return steps


def run_once(notebook: Path, folder: Path, mode: str, nproc: int, index: int) -> tuple[str, float]:
    parameters = {"solutions": True, "nproc": nproc, "smoke": mode == "smoke"}
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(notebook),
            str(folder / f"{index}-{mode}-nproc{nproc}.ipynb"),
            parameters=parameters,
            cwd=str(folder),
            kernel_name="python3",
            progress_bar=False,
        )
        outcome = "passed"
    except papermill.PapermillExecutionError as error:
        outcome = f"FAILED: {error.ename}: {error.evalue.splitlines()[0][:120] if error.evalue else ''}"
    return outcome, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequence", type=parse_sequence, default=parse_sequence("smoke:2,full:2,smoke:3"))
    parser.add_argument("notebooks", nargs="*", help="names or parts of names (default: all)")
    args = parser.parse_args()
    chosen = [nb for nb in NOTEBOOKS if not args.notebooks or any(part in nb.stem for part in args.notebooks)]
    if not chosen:
        parser.error(f"no notebook matches {args.notebooks}")
    os.environ["DDP_HELPERS_PROGRESS"] = "text"  # papermill keeps text, not widget state
    print("| notebook | run | nproc | result | s |\n|---|---|---:|---|---:|", flush=True)
    failed = False
    for notebook in chosen:
        folder = OUT / notebook.stem
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for index, (mode, nproc) in enumerate(args.sequence, start=1):
            outcome, seconds = run_once(notebook, folder, mode, nproc, index)
            failed |= outcome != "passed"
            print(f"| {notebook.stem} | {index}: {mode} | {nproc} | {outcome} | {seconds:.0f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
