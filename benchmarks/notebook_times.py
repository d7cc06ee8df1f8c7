"""How long a learner waits: each notebook under papermill, one after the other, with its slowest cells.

    python benchmarks/notebook_times.py [--full] [--nproc N] [--cells 3] [notebooks ...]

Smoke mode by default (what CI runs; the target is at most 60 s a notebook and 400 s for all of them);
``--full`` runs them as a learner does (smoke=False; target: 5 minutes a notebook). Prints a Markdown table
of wall times and of the jobs each notebook started (each launch() and start_ranks(), torchrun or
one-process, counted by the ``logs`` folder it leaves in its run folder, even when it was stopped
early: a count that, unlike the seconds, does not depend on the machine's load), then each notebook's slowest cells as papermill timed them, and writes
the figures to ``runs/notebook-times.json``. A failing notebook is reported with its error and timed all the same;
its whole error goes to stderr, and the executed notebook and its run folders are kept under
``runs/notebook-times-failed/<notebook>/`` (the rest is run in a temporary folder and deleted).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import papermill

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def slowest_cells(executed: Path, count: int) -> list[tuple[float, int, str]]:
    """(seconds, cell index, first line) of the `count` slowest code cells, from papermill's metadata."""
    nb = nbformat.read(executed, as_version=4)
    timed = []
    for index, cell in enumerate(nb.cells):
        duration = cell.metadata.get("papermill", {}).get("duration")
        if cell.cell_type == "code" and duration is not None:
            first_line = next((line for line in cell.source.splitlines() if line.strip()), "")
            timed.append((float(duration), index, first_line[:70]))
    return sorted(timed, reverse=True)[:count]


def jobs_started(folder: Path) -> int:
    """Jobs started under `folder`: each launch() or start_ranks() leaves a run folder's ``logs`` holding
    ``torchrun.log`` (torchrun) or ``python/`` (a one-process run)."""
    return sum(
        1
        for logs in folder.rglob("logs")
        if logs.is_dir() and ((logs / "torchrun.log").is_file() or (logs / "python").is_dir())
    )


def keep_failure(name: str, out_dir: Path) -> Path:
    """Copy the executed notebooks and run folders of `out_dir` (a temporary folder) to
    ``runs/notebook-times-failed/<name>/``, where they outlive it: a rank's log says why it failed."""
    kept = REPO / "runs" / "notebook-times-failed" / name
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(out_dir, kept, ignore=shutil.ignore_patterns("*.pt", "*.distcp"), symlinks=True)
    print(f"kept for a look: {kept.relative_to(REPO)}", file=sys.stderr, flush=True)
    return kept


def find_notebook(name: str) -> Path:
    """A notebook from a path, or from the start of its name in notebooks/ ("01", "01_first_ddp_program")."""
    path = Path(name)
    if path.suffix == ".ipynb" and path.is_file():
        return path
    matches = [nb for nb in NOTEBOOKS if nb.stem.startswith(path.stem) or nb.name == path.name]
    if len(matches) != 1:
        names = ", ".join(nb.stem for nb in NOTEBOOKS)
        found = "no notebook" if not matches else f"{len(matches)} notebooks"
        raise LookupError(f"{name!r} names {found} of notebooks/; give a path or one of: {names}")
    return matches[0]


def time_notebook(notebook: Path, parameters: dict, out_dir: Path) -> dict:
    executed = out_dir / notebook.name
    jobs_before = jobs_started(out_dir)
    started = time.perf_counter()
    error = None
    try:
        papermill.execute_notebook(
            str(notebook),
            str(executed),
            parameters=parameters,
            cwd=str(out_dir),
            kernel_name="python3",
            progress_bar=False,
            request_save_on_cell_execute=False,  # a learner's JupyterLab does not write after every cell
        )
    except Exception as err:  # report it and go on: one broken chapter must not hide the others' times
        error = str(err).strip().splitlines()[-1][:200] if str(err).strip() else type(err).__name__
        print(f"{notebook.name} failed:\n{err}", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started
    if error is not None:
        keep_failure(notebook.stem, out_dir)
    cells = slowest_cells(executed, 50) if executed.exists() else []
    jobs = jobs_started(out_dir) - jobs_before
    return {
        "notebook": notebook.stem,
        "seconds": round(seconds, 1),
        "jobs": jobs,
        "error": error,
        "slowest_cells": cells,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="smoke=False, as a learner runs them")
    parser.add_argument("--nproc", type=int, default=None, help="the notebooks' nproc (default: their own)")
    parser.add_argument("--cells", type=int, default=3, help="slowest cells to list per notebook")
    parser.add_argument(
        "notebooks",
        nargs="*",
        default=[],
        help="paths, or names in notebooks/ such as 01 or 01_first_ddp_program",
    )
    args = parser.parse_args(argv)
    try:
        notebooks = [find_notebook(name) for name in args.notebooks] or NOTEBOOKS
    except LookupError as err:
        parser.error(str(err))
    parameters: dict = {"smoke": not args.full, "solutions": True}  # exercises check their reference answers
    if args.nproc is not None:
        parameters["nproc"] = args.nproc
    os.environ.setdefault("DDP_HELPERS_PROGRESS", "text")  # papermill stores text, not widget state

    results = []
    with tempfile.TemporaryDirectory(prefix="notebook-times-") as tmp:
        for notebook in notebooks:
            print(f"running {notebook.name} ...", file=sys.stderr, flush=True)
            results.append(time_notebook(notebook.resolve(), parameters, Path(tmp)))

    mode = "full size" if args.full else "smoke mode"
    print(f"\n| notebook ({mode}) | seconds | jobs started | result |\n|---|---:|---:|---|")
    for r in results:
        outcome = "FAILED: " + r["error"] if r["error"] else "ok"
        print(f"| {r['notebook']} | {r['seconds']:.1f} | {r['jobs']} | {outcome} |")
    total_s, total_jobs = sum(r["seconds"] for r in results), sum(r["jobs"] for r in results)
    print(f"| **all** | **{total_s:.1f}** | **{total_jobs}** | |")
    for r in results:
        print(f"\n{r['notebook']}: slowest cells")
        for seconds, index, first_line in r["slowest_cells"][: args.cells]:
            print(f"  {seconds:7.1f} s  cell {index:>3}  {first_line}")
    out = REPO / "runs" / "notebook-times.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"mode": mode, "parameters": parameters, "results": results}, indent=1))
    print(f"\nwritten to {out.relative_to(REPO)}")
    return 1 if any(r["error"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
