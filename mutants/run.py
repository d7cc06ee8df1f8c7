"""make mutants: put each catalogued DDP bug into a throwaway copy of the project, run the notebook that teaches
the lesson it breaks (smoke mode), and report whether the notebook failed (killed) or passed (survived).

A mutant that survives is a lesson nobody checks. The catalogue is each chapter's `chNN_mutants.toml`, in its folder
(`ddp_helpers/chapters/chNN_*/`); each entry is an exact edit (`old` must occur exactly once in `file`: in a notebook, in exactly one
cell's source). Entries marked `cpu_unkillable` are listed with their reason, not run here; `--gpu` runs only
them (scripts/gpu_check.py does, on a GPU machine).

    python mutants/run.py                   # every mutant, two at a time
    python mutants/run.py --ci              # the subset marked ci = true, which .ci/run runs
    python mutants/run.py --only 01 no-set-epoch --jobs 1
    python mutants/run.py --list
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "ddp_helpers" / "chapters"  # each chapter's chNN_mutants.toml
REPORT_DIR = ROOT / "runs" / "mutants"
DEFAULT_NPROC = (2,)
MUTANT_TIMEOUT_S = (
    600  # a notebook's smoke run takes about a minute; a mutant that hangs it is killed by this
)
FIELDS = {
    "name", "notebook", "lesson", "file", "old", "new", "nproc", "cpu_unkillable", "kills_with", "ci",
    "exercise", "diagnosis",
}  # fmt: skip


class CatalogueError(ValueError):
    """A catalogue entry that cannot be applied as written."""


@dataclass(frozen=True)
class Mutant:
    name: str
    notebook: str  # the notebook's file stem, "01_first_ddp_program", or "deeper/01_..." for a companion
    lesson: str
    file: str  # relative to the project root
    old: str
    new: str
    nproc: tuple[int, ...] = DEFAULT_NPROC
    cpu_unkillable: str = ""  # why a CPU run cannot kill it, and the shape that would
    kills_with: str = ""  # a regex the failure must match, where another failure would prove nothing
    ci: bool = False  # in the subset that CI runs (--ci): the whole catalogue takes too long for CI
    # a wrong answer to an exercise: `old` -> `new` in its reference answer, which the checker must name
    # with `diagnosis` (tests/kernel/test_exercises.py); the notebook, checking the reference, fails on it too
    exercise: str = ""
    diagnosis: str = ""


@dataclass
class Outcome:
    mutant: Mutant
    nproc: int
    status: str  # killed, survived, timeout, invalid, unkillable
    failure: str = ""
    cell: int | None = None
    seconds: float = 0.0
    log: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.status in ("killed", "unkillable")  # a hang the notebook did not catch is a fault too


# ------------------------------------------------------------------------------------------ the catalogue
def notebook_stems(root: Path = ROOT) -> list[str]:
    """The lessons by stem ("01_first_ddp_program") and their companions by path ("deeper/01_...")."""
    lessons = sorted(p.stem for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    companions = sorted(
        f"deeper/{p.stem}" for p in (root / "notebooks" / "deeper").glob("[0-9][0-9]_*.ipynb")
    )
    return lessons + companions


def short_name(notebook: str) -> str:
    """ "01" for a lesson, "01 deeper" for its companion: the report's notebook column."""
    return f"{notebook[7:9]} deeper" if notebook.startswith("deeper/") else notebook[:2]


def load_catalogue(directory: Path = CATALOGUE, root: Path = ROOT) -> list[Mutant]:
    stems = notebook_stems(root)
    mutants: list[Mutant] = []
    for path in sorted(directory.rglob("*.toml")):
        for entry in tomllib.loads(path.read_text()).get("mutant", []):
            mutants.append(_mutant(entry, path.name, stems))
    names = [m.name for m in mutants]
    doubles = sorted({n for n in names if names.count(n) > 1})
    if doubles:
        raise CatalogueError(f"mutant names must be unique; repeated: {doubles}")
    return mutants


def _mutant(entry: dict, source: str, stems: list[str]) -> Mutant:
    where = f"{source}: mutant {entry.get('name', '?')!r}"
    unknown = set(entry) - FIELDS
    missing = {"name", "notebook", "lesson", "file", "old", "new"} - set(entry)
    if unknown or missing:
        raise CatalogueError(f"{where}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
    matches = [s for s in stems if s == entry["notebook"] or s.startswith(f"{entry['notebook']}_")]
    if len(matches) != 1:
        raise CatalogueError(f"{where}: notebook {entry['notebook']!r} names none of {stems}")
    if entry["old"] == entry["new"]:
        raise CatalogueError(f"{where}: old and new are the same text")
    nproc = tuple(entry.get("nproc", DEFAULT_NPROC))
    if not nproc or any(not isinstance(n, int) or n < 1 for n in nproc):
        raise CatalogueError(f"{where}: nproc must be a list of positive ints, got {nproc}")
    return Mutant(
        name=entry["name"],
        notebook=matches[0],
        lesson=entry["lesson"],
        file=entry["file"],
        old=entry["old"],
        new=entry["new"],
        nproc=nproc,
        cpu_unkillable=entry.get("cpu_unkillable", ""),
        kills_with=entry.get("kills_with", ""),
        ci=bool(entry.get("ci", False)),
        exercise=entry.get("exercise", ""),
        diagnosis=entry.get("diagnosis", ""),
    )


# ------------------------------------------------------------------------------------------ applying one
def project_files(root: Path = ROOT) -> list[str]:
    """What a clean clone holds, plus files not yet committed (but never ignored ones: venvs, runs/)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return [f for f in out.decode().split("\0") if f and (root / f).is_file()]


def copy_project(target: Path, root: Path = ROOT) -> None:
    for rel in project_files(root):
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest)


def apply(mutant: Mutant, project: Path) -> None:
    """Make the mutant's edit in `project`; raise CatalogueError where it does not apply exactly once."""
    path = project / mutant.file
    if not path.is_file():
        raise CatalogueError(f"{mutant.name}: no file {mutant.file}")
    if path.suffix == ".ipynb":
        _apply_to_notebook(mutant, path)
        return
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise CatalogueError(f"{mutant.name}: the old text occurs {count} times in {mutant.file}, not once")
    text = text.replace(mutant.old, mutant.new)
    if path.suffix == ".py":
        _must_parse(mutant, text)
    path.write_text(text)


def _apply_to_notebook(mutant: Mutant, path: Path) -> None:
    nb = json.loads(path.read_text())
    hits = [
        (i, "".join(c["source"]).count(mutant.old))
        for i, c in enumerate(nb["cells"])
        if mutant.old in "".join(c["source"])
    ]
    if len(hits) != 1 or hits[0][1] != 1:
        raise CatalogueError(
            f"{mutant.name}: the old text must occur once in one cell of {mutant.file}; found {hits or 'none'}"
        )
    cell = nb["cells"][hits[0][0]]
    source = "".join(cell["source"]).replace(mutant.old, mutant.new)
    if cell["cell_type"] == "code" and not source.lstrip().startswith("%%"):
        _must_parse(mutant, re.sub(r"(?m)^(\s*)[%!].*$", r"\1pass", source))
    cell["source"] = source.splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def _must_parse(mutant: Mutant, source: str) -> None:
    """A mutant is a plausible bug, never a syntax error that fails for another reason."""
    try:
        ast.parse(source)
    except SyntaxError as error:
        raise CatalogueError(f"{mutant.name}: the edit leaves {mutant.file} unparsable: {error}") from error


# ------------------------------------------------------------------------------------------ running one
def run_one(
    mutant: Mutant, nproc: int, timeout_s: float = MUTANT_TIMEOUT_S, keep: Path | None = None
) -> Outcome:
    outcome = Outcome(mutant, nproc, status="survived")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-", ignore_cleanup_errors=True) as tmp:
        project = Path(tmp) / "project"
        copy_project(project)
        try:
            apply(mutant, project)
        except CatalogueError as error:
            outcome.status, outcome.failure = "invalid", str(error)
            return outcome
        workdir = Path(tmp) / "work"
        workdir.mkdir()
        env = _env_for(project)
        _check_imports_from(project, env)
        executed = workdir / f"{Path(mutant.notebook).name}.ipynb"
        command = [
            sys.executable, "-m", "papermill", str(project / "notebooks" / f"{mutant.notebook}.ipynb"),
            str(executed), "-p", "smoke", "True", "-p", "solutions", "True", "-p", "nproc", str(nproc), "--cwd", str(workdir),
            "-k", "python3", "--no-progress-bar", "--execution-timeout", str(int(timeout_s)),
            "--no-request-save-on-cell-execute",  # written when it ends (and every 30 s): a save per cell costs CPU
        ]  # fmt: skip
        try:
            proc = subprocess.run(
                command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s + 60
            )
            outcome.log = proc.stdout + proc.stderr
            if proc.returncode != 0:
                outcome.status = "killed"
                outcome.cell, outcome.failure = _first_error(executed, outcome.log)
        except subprocess.TimeoutExpired:
            outcome.status, outcome.failure = "timeout", f"the notebook ran past {timeout_s:.0f} s"
        if (
            outcome.status == "killed"
            and mutant.kills_with
            and not re.search(mutant.kills_with, outcome.failure)
        ):
            outcome.status = "survived"
            outcome.failure = (
                f"failed, but not as kills_with /{mutant.kills_with}/ expects: {outcome.failure}"
            )
        if keep is not None and executed.exists():
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(executed, keep / f"{mutant.name}-nproc{nproc}.ipynb")
    outcome.seconds = time.monotonic() - start
    return outcome


def _env_for(project: Path) -> dict[str, str]:
    env = dict(os.environ)
    # the copy's package first: before the venv's editable install of the real one, in the kernel and in
    # every process it starts (torchrun, the workers)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project), env.get("PYTHONPATH")]))
    env["DDP_HELPERS_PROGRESS"] = "text"
    env.pop("JPY_PARENT_PID", None)
    return env


def _check_imports_from(project: Path, env: dict[str, str]) -> None:
    found = subprocess.run(
        [sys.executable, "-c", "import ddp_helpers; print(ddp_helpers.__file__)"],
        cwd=project.parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(project.resolve()):
        raise RuntimeError(f"the mutated copy is not what runs: ddp_helpers imports from {found}")


def _first_error(executed: Path, log: str) -> tuple[int | None, str]:
    """The cell that failed and its error's first lines (from the executed notebook, else papermill's log)."""
    if executed.exists():
        nb = json.loads(executed.read_text())
        # number the cells as the stored notebook does: without papermill's error banners and parameters
        added = ("papermill-error-cell-tag", "injected-parameters")
        cells = [c for c in nb["cells"] if not set(c["metadata"].get("tags", [])) & set(added)]
        for index, cell in enumerate(cells):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    text = f"{output.get('ename')}: {output.get('evalue')}"
                    return index, _ANSI.sub("", text).strip()[:300]
    tail = [line for line in _ANSI.sub("", log).splitlines() if line.strip()]
    return None, " | ".join(tail[-3:])[:300]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ------------------------------------------------------------------------------------------ the report
def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| mutant | notebook | nproc | result | cell | the assert that failed | s |",
        "|---|---|---:|---|---:|---|---:|",
    ]
    for o in outcomes:
        failure = (o.failure or "").replace("|", "\\|").replace("\n", " ")
        cell = "" if o.cell is None else str(o.cell)
        lines.append(
            f"| {o.mutant.name} | {short_name(o.mutant.notebook)} | {o.nproc} | {o.status} | {cell} | {failure} | {o.seconds:.0f} |"
        )
    return "\n".join(lines)


def select(mutants: list[Mutant], only: list[str], gpu: bool, ci: bool = False) -> list[Mutant]:
    chosen = [m for m in mutants if bool(m.cpu_unkillable) == gpu and (m.ci or not ci)]
    if only:
        names = {o for o in only if any(m.name == o for m in mutants)}
        notebooks = [o for o in only if o not in names]
        # names narrow the notebooks given with them: `--only 01 no-set-epoch` is that one mutant of 01
        chosen = [
            m
            for m in chosen
            if (not names or m.name in names) and (not notebooks or m.notebook.startswith(tuple(notebooks)))
        ]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", nargs="*", default=[], help="mutant names or notebook prefixes (01, 03_mixed..., deeper/01)"
    )
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--nproc", type=int, help="run every chosen mutant at this nproc only")
    parser.add_argument("--timeout", type=float, default=MUTANT_TIMEOUT_S, help="seconds per mutant run")
    parser.add_argument("--list", action="store_true", help="print the catalogue and run nothing")
    parser.add_argument("--gpu", action="store_true", help="run only the mutants a CPU cannot kill")
    parser.add_argument(
        "--ci", action="store_true", help="run only the subset marked ci = true (what CI runs)"
    )
    parser.add_argument("--keep", type=Path, help="keep each executed notebook in this folder")
    parser.add_argument(
        "--catalogue",
        type=Path,
        default=CATALOGUE,
        help="a folder holding *.toml catalogue files, at any depth",
    )
    parser.add_argument(
        "--report", type=Path, default=REPORT_DIR, help="where mutants.md and mutants.json go"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    mutants = load_catalogue(args.catalogue)
    chosen = select(mutants, args.only, args.gpu, args.ci)
    if args.only and not chosen:
        parser.error(f"no mutant matches {args.only}")
    if args.list:
        for m in mutants:
            mark = f"  [CPU-unkillable: {m.cpu_unkillable}]" if m.cpu_unkillable else ""
            print(f"{short_name(m.notebook):9}  {m.name:38} {m.lesson}{mark}")
        print(f"{len(mutants)} mutants")
        return 0

    unkillable = (
        []
        if args.gpu
        else [Outcome(m, 0, "unkillable", m.cpu_unkillable) for m in mutants if m.cpu_unkillable]
    )
    runs = [(m, n) for m in chosen for n in ((args.nproc,) if args.nproc else m.nproc)]
    if not runs:  # nothing run must never read as every mutant killed
        parser.error("no mutant is chosen" + (": none is marked ci = true" if args.ci else ""))
    print(
        f"{len(runs)} mutant runs, {args.jobs} at a time; {len(unkillable)} listed as CPU-unkillable",
        flush=True,
    )
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, m, n, args.timeout, args.keep) for m, n in runs]
        for future in concurrent.futures.as_completed(futures):
            outcome = future.result()
            with lock:
                outcomes.append(outcome)
                print(
                    f"[{len(outcomes)}/{len(runs)}] {outcome.status:9} {outcome.mutant.name} (nproc {outcome.nproc}, "
                    f"{outcome.seconds:.0f} s): {outcome.failure[:160]}",
                    flush=True,
                )
                if outcome.status in ("survived", "invalid") and outcome.log:
                    print(outcome.log[-3000:], flush=True)
    order = {(m.name, n): i for i, (m, n) in enumerate(runs)}
    outcomes.sort(key=lambda o: order[(o.mutant.name, o.nproc)])
    report = table(outcomes + unkillable)
    args.report.mkdir(parents=True, exist_ok=True)
    (args.report / "mutants.md").write_text(report + "\n")
    rows = [
        {"name": o.mutant.name, "notebook": o.mutant.notebook, "nproc": o.nproc, "status": o.status}
        | {"cell": o.cell, "failure": o.failure, "seconds": round(o.seconds, 1)}
        for o in outcomes + unkillable
    ]
    (args.report / "mutants.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(report)
    bad = [o for o in outcomes if not o.ok]
    print(
        f"{sum(o.status == 'killed' for o in outcomes)} killed, {len(bad)} survived, timed out or invalid, "
        f"{len(unkillable)} CPU-unkillable; {time.monotonic() - start:.0f} s"
    )
    for o in unkillable:
        print(f"CPU-unkillable {o.mutant.name}: {o.failure}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
