"""Every notebook runs headless under papermill in smoke mode, and is stored without outputs.

Each stage of CI runs every notebook once, at a shape no other stage repeats:
- `make test`: the notebook's default ranks (2 on the CPU), on the newest torch;
- `make test-shapes` (DDP_TEST_SHAPES=1): ``nproc=1`` (a one-GPU box), run in the folder where the
  notebook has just run at its default ranks (a rerun with another parameter), and the multi-node
  notebook at full size, on the newest torch;
- `make test-compat` (DDP_TEST_NPROC=3): ``nproc=3`` (an odd world), on the container's torch 2.7.1.
"""

from __future__ import annotations

import ast
import os
import re
import time
from pathlib import Path

import nbformat
import papermill
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# the lessons' companions (notebooks/deeper/): run in a stage of their own, make test-deeper
COMPANIONS = sorted(
    (Path(__file__).resolve().parent.parent / "notebooks" / "deeper").glob("[0-9][0-9]_*.ipynb")
)
EVERY_NOTEBOOK = NOTEBOOKS + COMPANIONS
SHAPES_ENV = "DDP_TEST_SHAPES"
DEEPER_ENV = "DDP_TEST_DEEPER"
NPROC_ENV = "DDP_TEST_NPROC"  # the smoke run's nproc; unset: the notebook's own default
shapes = pytest.mark.skipif(
    not os.environ.get(SHAPES_ENV), reason=f"make test-shapes ({SHAPES_ENV}=1) runs these"
)
deeper = pytest.mark.skipif(
    not os.environ.get(DEEPER_ENV), reason=f"make test-deeper ({DEEPER_ENV}=1) runs the companion notebooks"
)
MULTINODE = next((nb for nb in NOTEBOOKS if "multinode" in nb.stem), None)


def notebook_id(path: Path) -> str:
    return f"deeper-{path.stem}" if path.parent.name == "deeper" else path.stem


def _parameters_cell(notebook: Path) -> str:
    nb = nbformat.read(notebook, as_version=4)
    (tagged,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    return tagged.source


def _execute(notebook: Path, tmp_path: Path, monkeypatch, parameters: dict, timeout: int = 600) -> None:
    monkeypatch.setenv("DDP_HELPERS_PROGRESS", "text")  # papermill stores text, not widget state
    monkeypatch.chdir(tmp_path)  # the notebook's runs/ folder lands here, not in the repo
    papermill.execute_notebook(
        str(notebook),
        str(tmp_path / notebook.name),
        parameters=parameters,
        cwd=str(tmp_path),
        kernel_name="python3",
        progress_bar=False,
        execution_timeout=timeout,
        # papermill writes the notebook when it ends, failed or not (and every 30 s); a write after every
        # cell as well cost 1.3 to 1.7 CPU-seconds more per notebook run here (notebook 07, 2 cores)
        request_save_on_cell_execute=False,
    )


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("notebook", EVERY_NOTEBOOK, ids=notebook_id)
def test_notebook_is_stored_without_outputs(notebook):
    nb = nbformat.read(notebook, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{notebook.name}: cells {dirty} have outputs; clear them before committing"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "smoke = False" in tagged[0].source


@pytest.mark.notebooks
@pytest.mark.timeout(900)  # a notebook is many launches; pytest's 300 s suits one test, not a chapter
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(notebook, tmp_path, monkeypatch):
    nproc = os.environ.get(NPROC_ENV)
    if nproc:
        check_notebook_runs_with_nproc(notebook, int(nproc), tmp_path, monkeypatch)
    else:
        _execute(notebook, tmp_path, monkeypatch, {"smoke": True, "solutions": True})


@deeper
@pytest.mark.notebooks
@pytest.mark.timeout(900)
@pytest.mark.parametrize("notebook", COMPANIONS, ids=notebook_id)
def test_companion_runs_in_smoke_mode(notebook, tmp_path, monkeypatch):
    """Each lesson's companion (notebooks/deeper/) keeps its measurements and checks: it runs as the lesson does."""
    _execute(notebook, tmp_path, monkeypatch, {"smoke": True, "solutions": True})


def test_every_companion_belongs_to_a_lesson():
    lessons = {nb.stem[:2] for nb in NOTEBOOKS}
    orphans = [nb.name for nb in COMPANIONS if nb.stem[:2] not in lessons]
    assert not orphans, f"companions whose number names no lesson: {orphans}"


# ------------------------------------------------------------------------ the kernel never touches CUDA
# torch.cuda calls that do not initialise CUDA in the calling process (get_device_name and friends
# do: ask `ddp_helpers.kernel.lab.doctor.collect_facts()["gpus"]`, which reads them in a child process)
CUDA_QUERIES = {"is_available", "device_count", "is_initialized"}
# these cells run in the ranks (or, %%writefile, nowhere: a script for torchrun), not in the kernel
OUTSIDE_KERNEL_MAGICS = ("%%ranks", "%%exercise", "%%writefile")


def _names_cuda(node: ast.AST) -> bool:
    """A literal "cuda..." device, or torch.device("cuda"...)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith("cuda")
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.device", "device") and node.args:
        return _names_cuda(node.args[0])
    return False


def cuda_calls_in_kernel(source: str) -> list[str]:
    """The calls in one code cell that would create a CUDA context in the notebook kernel.

    Worker sources inside strings are not code here, %%ranks cells run in the ranks, and %%writefile
    cells write a script.
    """
    first_line = source.lstrip().split("\n", 1)[0]
    if first_line.startswith(OUTSIDE_KERNEL_MAGICS):
        return []
    if first_line.startswith("%%"):  # %%time and friends run the rest of the cell in the kernel
        source = source.lstrip().split("\n", 1)[1] if "\n" in source.lstrip() else ""
    # line magics and shell escapes are not Python: keep the line count, drop the text
    source = re.sub(r"(?m)^(\s*)[%!].*$", r"\1pass", source)
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        text = ast.unparse(node)
        if func.startswith("torch.cuda.") and func.split(".")[2] not in CUDA_QUERIES:
            found.append(text)
        elif func.endswith(".cuda"):  # model.cuda(), x.cuda(rank)
            found.append(text)
        elif func.endswith((".to", "set_default_device")) and node.args and _names_cuda(node.args[0]):
            found.append(text)
        elif any(k.arg == "device" and _names_cuda(k.value) for k in node.keywords):
            found.append(text)
    return found


@pytest.mark.parametrize(
    "source",
    [
        "torch.cuda.set_device(0)",
        "x = model.cuda()",
        "x = torch.ones(2).to('cuda')",
        "x = torch.ones(2).to(torch.device('cuda', 0))",
        "torch.cuda.synchronize()",
        "free, total = torch.cuda.mem_get_info()",
        "torch.cuda.memory_allocated()",
        'print(f"on {torch.cuda.get_device_name(0)}")',
        "torch.zeros(3, device='cuda:0')",
        "%%time\ny = torch.randn(2, device=torch.device('cuda'))",
        "%matplotlib inline\ntorch.set_default_device('cuda')",
    ],
)
def test_the_cuda_scan_catches_kernel_side_cuda(source):
    assert cuda_calls_in_kernel(source), source


@pytest.mark.parametrize(
    "source",
    [
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0",
        "%%ranks\ntorch.cuda.set_device(local_rank)\nx = torch.ones(1).cuda()",
        "%%writefile runs/w.py\nx = torch.zeros(1, device='cuda')",
        'worker = write_worker("w", source="""\nimport torch\ntorch.cuda.set_device(0)\n""")',
        "x = torch.ones(2).to('cpu')\ny = torch.zeros(2, device=device)",
    ],
)
def test_the_cuda_scan_leaves_ranks_workers_and_queries_alone(source):
    assert cuda_calls_in_kernel(source) == []


@pytest.mark.parametrize("notebook", EVERY_NOTEBOOK, ids=notebook_id)
def test_notebook_kernel_never_creates_a_cuda_context(notebook):
    """Found by reading the cells, so this holds without a GPU: the ranks own the GPUs."""
    nb = nbformat.read(notebook, as_version=4)
    found = {
        i: calls
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (calls := cuda_calls_in_kernel(cell.source))
    }
    assert not found, f"{notebook.name}: these cells would create a CUDA context in the kernel: {found}"


# ------------------------------------------------------------------------------------ machine shapes
def _local_world_sizes(run_root: Path, since: float = 0.0) -> set[int]:
    """Ranks per torchrun agent (or per one-process run), read from the per-rank log folders it left
    (those made after `since`, a time.time(): a rerun's, not the earlier run's)."""
    sizes = set()
    for attempt in run_root.rglob("attempt_0"):
        if attempt.stat().st_mtime < since:
            continue
        ranks = [p for p in attempt.iterdir() if p.is_dir() and p.name.isdigit()]
        if ranks:
            sizes.add(len(ranks))
    return sizes


@shapes
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell_declares_nproc(notebook):
    assigned = {
        target.id
        for node in ast.parse(_parameters_cell(notebook)).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert "nproc" in assigned, f"{notebook.name}: its parameters cell has no `nproc`"


@shapes
@pytest.mark.notebooks
@pytest.mark.timeout(900)
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_reruns_in_its_folder_with_nproc_1(notebook, tmp_path, monkeypatch):
    """One GPU gives nproc=1. (nproc=3, an odd world, runs in make test-compat: DDP_TEST_NPROC=3.)

    As a learner changes a parameter and runs the notebook again: first at its default ranks, then at
    nproc=1 in the same folder, over what the first run left (runs/, checkpoints, workers)."""
    _execute(notebook, tmp_path, monkeypatch, {"smoke": True, "solutions": True})
    check_notebook_runs_with_nproc(notebook, 1, tmp_path, monkeypatch)


def check_notebook_runs_with_nproc(notebook: Path, nproc: int, tmp_path: Path, monkeypatch) -> None:
    """An odd world catches `world // 2` and hard-coded pairs; nproc=1 the demos that need two ranks."""
    test_parameters_cell_declares_nproc(notebook)  # a notebook without it would pass without using it
    started = int(time.time())  # whole seconds: some filesystems keep no finer folder times
    _execute(notebook, tmp_path, monkeypatch, {"smoke": True, "solutions": True, "nproc": nproc})
    sizes = _local_world_sizes(tmp_path, since=started)
    if nproc == 1 and 1 not in sizes:
        # a demo that needs two ranks runs two at nproc=1, and must say so (its plan's line)
        executed = nbformat.read(tmp_path / notebook.name, as_version=4)
        said = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
        assert 2 in sizes and "2 rank" in said, (
            f"{notebook.name}: at nproc=1 no launch ran 1 rank, nor 2 ranks with a line saying so (saw {sorted(sizes)})"
        )
        return
    assert nproc in sizes, (
        f"{notebook.name}: no launch ran {nproc} ranks (saw {sorted(sizes)}); is nproc used?"
    )


@shapes
@pytest.mark.notebooks
@pytest.mark.timeout(1200)
@pytest.mark.skipif(MULTINODE is None, reason="no multi-node notebook")
def test_multinode_notebook_runs_at_full_size(tmp_path, monkeypatch):
    """As a learner runs it (smoke=False): two agents, the full bandwidth sweep, the 20 s lonely node."""
    assert MULTINODE is not None  # the skipif above
    _execute(MULTINODE, tmp_path, monkeypatch, {"solutions": True}, timeout=900)


# ------------------------------------------------------------------------- words a learner misreads
# "the seed" once meant the container guide, which a learner reads as a random seed: say "the container guide".
GUIDE_AS_SEED = re.compile(
    r"\bseed's\b|\bseed (?:container|guide|template|image|claims?|says)\b|\bthe seed\b(?= (?:says|claims|promises|shows))",
    re.IGNORECASE,
)
README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.parametrize("document", [*EVERY_NOTEBOOK, README], ids=notebook_id)
def test_the_container_guide_is_never_called_the_seed(document):
    text = document.read_text()
    found = sorted({m.group(0) for m in GUIDE_AS_SEED.finditer(text)})
    assert not found, f"{document.name} calls the container guide {found}: say 'the container guide'"


# ------------------------------------------------------------------ one notebook's edit stays in it
@pytest.mark.parametrize("notebook", EVERY_NOTEBOOK, ids=notebook_id)
def test_a_notebook_writes_its_workers_into_a_folder_of_its_own(notebook):
    """A learner's edit to a worker one notebook wrote (runs/workers/03/train.py) never changes what
    another notebook runs: each writes its copies under runs/workers/<its number>."""
    number = notebook.stem[:2]
    nb = nbformat.read(notebook, as_version=4)
    folders = {
        match
        for cell in nb.cells
        if cell.cell_type == "code"
        for match in re.findall(r"runs/workers(?:/[\w.]+)?", cell.source)
    }
    shared = sorted(f for f in folders if not f.startswith(f"runs/workers/{number}"))
    assert not shared, f"{notebook.name} writes or reads workers outside runs/workers/{number}: {shared}"


@pytest.mark.parametrize("notebook", EVERY_NOTEBOOK, ids=notebook_id)
def test_no_notebook_reaches_into_the_launchers_internals(notebook):
    """A cell a learner reads uses the package's public names (ddp_helpers, ddp_helpers.kernel.lab), not the
    modules behind them, which may change."""
    nb = nbformat.read(notebook, as_version=4)
    found = {
        i: line.strip()
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if re.search(r"^\s*(from|import)\s+ddp_helpers\.launcher\b|\bddp_helpers\.launcher\.\w+\(", line)
    }
    assert not found, f"{notebook.name} imports launcher internals: {found}"


@pytest.mark.parametrize("notebook", EVERY_NOTEBOOK, ids=notebook_id)
def test_no_cell_a_learner_reads_escapes_the_formatter(notebook):
    """A `# fmt: skip` keeps a line as someone typed it, often too long to read: reshape it instead."""
    nb = nbformat.read(notebook, as_version=4)
    marked = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "fmt: skip" in c.source]
    assert not marked, f"{notebook.name}: cells {marked} carry # fmt: skip"
