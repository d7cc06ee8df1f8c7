"""The package's sides, checked: what runs in a rank never imports what runs in the kernel.

docs/architecture.md draws the sides. A worker pays nothing for the launcher, and a rank never loads
the code that starts, watches or plots runs; the launcher never depends on the lab (the displays).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ddp_helpers"

# The sides are folders. ddp_helpers/kernel/ runs only in the Jupyter kernel (and the command line);
# ddp_helpers/rank/ and ddp_helpers/workers/ run inside a rank (the kernel may import them too). A chapter's
# folder holds both: its chNN_* modules are what the workbench imports (the plan and the views in the
# kernel; the exercises, which run on the live ranks, are reached from rank/registry.py), and every
# other module of it is a script torchrun runs, or a part such a script imports.
KERNEL = "ddp_helpers.kernel"
CHAPTERS = PACKAGE / "chapters"
CHAPTER_OWN = re.compile(r"ch\d\d_|__init__")  # a chapter's plan, views and exercises, its package


ROOT = PACKAGE.parent


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def rank_entry_points() -> list[Path]:
    """The modules a rank starts from: the rank side's folders and every chapter script."""
    scripts = [p for p in sorted(CHAPTERS.glob("ch*/*.py")) if not CHAPTER_OWN.match(p.name)]
    return sorted((PACKAGE / "rank").rglob("*.py")) + sorted((PACKAGE / "workers").glob("*.py")) + scripts


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code, with relative imports resolved."""
    return imports_in(path.read_text(), module_name(path), is_package=path.name == "__init__.py")


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import protocol`
    return found


def package_file(module: str, roots: tuple[Path, ...] = (ROOT,)) -> Path | None:
    """The file of a ddp_helpers module (a package's __init__.py), or None: a name in a module, or not ours."""
    for root in roots:
        path = root.joinpath(*module.split("."))
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def kernel_reached_from(start: Path, overlay: Path | None = None) -> list[str]:
    """The import chains from `start` that end in the kernel side, following ddp_helpers' own imports.

    Importing a.b.c runs the packages a.b and a first: their __init__.py files are followed too.
    `overlay`: a folder holding planted ddp_helpers/... files, looked up before the package itself (the
    tests below plant there, never in the package, which other test processes read meanwhile)."""
    roots = (overlay, ROOT) if overlay else (ROOT,)

    def name(path: Path) -> str:
        return module_name(path, next(root for root in roots if path.is_relative_to(root)))

    chains, seen, todo = [], {start}, [(start, [name(start)])]
    while todo:
        path, chain = todo.pop()
        imports = imports_in(path.read_text(), name(path), is_package=path.name == "__init__.py")
        for imported in sorted(m for m in imports if m.startswith("ddp_helpers")):
            parts = imported.split(".")
            for module in (".".join(parts[:i]) for i in range(2, len(parts) + 1)):
                if module == KERNEL or module.startswith(KERNEL + "."):
                    chains.append(" -> ".join([*chain, imported]))
                    break
                found = package_file(module, roots)
                # ddp_helpers/__init__.py loads its names on first use (PEP 562), in the kernel: a rank
                # importing ddp_helpers.rank.x loads none of them (test_importing_the_rank_side_loads_...)
                if found is not None and found not in seen:
                    seen.add(found)
                    todo.append((found, [*chain, module]))
    return chains


@pytest.mark.parametrize("path", rank_entry_points(), ids=lambda p: module_name(p))
def test_nothing_a_rank_runs_reaches_the_kernel_side(path):
    chains = kernel_reached_from(path)
    assert not chains, f"{module_name(path)} runs in a rank but reaches the kernel side: {chains}"


def test_the_rank_side_reaches_every_exercise_and_the_sides_are_found():
    # the check above sees what it must: the exercises (through rank/registry.py), the chapters' scripts
    entries = {module_name(p) for p in rank_entry_points()}
    assert {
        "ddp_helpers.rank.live_server",
        "ddp_helpers.rank.rank_call",
        "ddp_helpers.workers.train",
    } <= entries
    assert "ddp_helpers.chapters.ch01_first_program.ddp" in entries
    chapter_modules = [name.rsplit(".", 1)[1] for name in entries if name.startswith("ddp_helpers.chapters.")]
    assert len(chapter_modules) > 15 and not [
        m for m in chapter_modules if m[:2] == "ch" and m[2:4].isdigit()
    ]
    registry = imported_modules(PACKAGE / "rank" / "registry.py")
    assert "ddp_helpers.chapters.ch04_checkpointing.ch04_exercises" in registry


def test_the_check_sees_kernel_imports_however_they_are_written():
    # the checks above must be able to fail: relative, nested and absolute imports are all resolved
    source = (
        "from ..kernel.launcher.runner import launch\n"
        "def f():\n    from .. import kernel\n"
        "import ddp_helpers.kernel.live.ranks\n"
        "from ..kernel.live import live_magics\n"
    )
    kernel = {m for m in imports_in(source, "ddp_helpers.rank.live_server") if m.startswith(KERNEL)}
    assert {
        "ddp_helpers.kernel.launcher.runner",
        "ddp_helpers.kernel.live.ranks",
        "ddp_helpers.kernel",
    } <= kernel
    assert "ddp_helpers.kernel.live.live_magics" in kernel


def _plant(overlay: Path, module: str, source: str) -> Path:
    """A module's file under `overlay` (ddp_helpers/... as in the package), with `source`."""
    path = overlay.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def test_a_chain_through_a_chapters_kernel_view_is_followed_to_the_kernel(tmp_path):
    # a rank script that imports a chapter's view (which imports the kernel) is caught two steps away
    planted = _plant(
        tmp_path,
        "ddp_helpers.rank.planted",
        "from ddp_helpers.rank import teardown\nfrom ddp_helpers.chapters.ch05_debugging import ch05_hang_tools\n",
    )
    chains = kernel_reached_from(planted, overlay=tmp_path)
    assert any("ch05_hang_tools -> ddp_helpers.kernel." in chain for chain in chains), chains
    assert not kernel_reached_from(CHAPTERS / "ch04_checkpointing" / "sum_order.py")


def test_a_package_init_on_the_way_is_followed(tmp_path):
    # importing ddp_helpers.chapters.chNN.x runs chNN's __init__.py first: a kernel import there is caught
    _plant(
        tmp_path,
        "ddp_helpers.chapters.ch99_planted.__init__",
        "from ddp_helpers.kernel.launcher import runner\n",
    )
    _plant(tmp_path, "ddp_helpers.chapters.ch99_planted.script", "import torch\n")
    planted = _plant(
        tmp_path, "ddp_helpers.rank.planted", "from ddp_helpers.chapters.ch99_planted.script import torch\n"
    )
    chains = kernel_reached_from(planted, overlay=tmp_path)
    assert any("ch99_planted -> ddp_helpers.kernel." in chain for chain in chains), chains


def test_importing_the_rank_side_loads_no_kernel_module():
    # what a rank really loads: torch aside, nothing of the kernel side
    names = [module_name(p) for p in sorted((PACKAGE / "rank").glob("*.py")) if p.name != "__init__.py"]
    code = (
        f"import sys, {', '.join(names)}\n"
        "from ddp_helpers.rank.registry import all_exercises\n"
        "all_exercises()\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('ddp_helpers'))))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [m for m in loaded if m.startswith(KERNEL)], loaded
    assert "ddp_helpers.rank.live_server" in loaded and "ddp_helpers.rank.answer_runner" in loaded


def test_the_launcher_does_not_depend_on_the_lab():
    for path in sorted((PACKAGE / "kernel" / "launcher").glob("*.py")):
        lab = sorted(m for m in imported_modules(path) if m.startswith("ddp_helpers.kernel.lab"))
        assert not lab, f"{module_name(path)} imports {lab}"


def test_no_two_modules_share_a_file_name():
    names = [p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    assert len(names) > 100  # the scan sees the package
    assert sorted({n for n in names if names.count(n) > 1}) == []


# a function on one screen. No cap on a module's lines: a module is cut by concern (a cap of 400 split
# train.py in five and handmade_ddp.py in two to fit it, not the design: issue 62)
MAX_FUNCTION_LINES = 60
SOURCES = sorted(PACKAGE.rglob("*.py")) + sorted((PACKAGE.parent / "scripts").glob("*.py"))


def _lines(node: ast.stmt) -> int:
    assert node.end_lineno is not None, "ast.parse sets every statement's end"
    return node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_functions_stay_small(path):
    text = path.read_text()
    long = [
        f"{node.name} ({_lines(node)} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _lines(node) > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


# ------------------------------------------------------------- the kernel-rank contract, spelled once
CONTRACT_MODULE = PACKAGE / "run_contract.py"


def _contract_names() -> set[str]:
    from ddp_helpers import run_contract

    return {value for name, value in vars(run_contract).items() if name.isupper() and isinstance(value, str)}


def test_every_environment_name_and_run_file_is_spelled_in_the_contract_alone():
    """run_contract.py owns the names the kernel and the ranks share: a module that spelled one out
    again could drift from it, and a rank would then look for a file the launcher never writes."""
    names = _contract_names()
    assert {"DDP_RUN_DIR", "summary.json", "stderr.log"} <= names  # the scan below looks for something
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == CONTRACT_MODULE:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        found += [
            f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings
        ]
    assert not found, f"import these from ddp_helpers.run_contract instead: {found}"


# ------------------------------------------------------------------------- every test can fail
TESTS = PACKAGE.parent / "tests"
# tests whose check is code they run, not an assert of their own: each with where its assert is
CHECKED_ELSEWHERE = {
    "test_notebook_07_live_check_holds_however_often_its_cells_rerun": "notebook 07's own check cell, run on ranks",
}


def _checking_helpers(trees: list[ast.Module]) -> set[str]:
    """Functions of the tests that assert, or raise on failure (papermill does, for a failed cell)."""
    helpers = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"):
                source = ast.unparse(node)
                if "assert" in source or "raises" in source or "execute_notebook" in source:
                    helpers.add(node.name)
    return helpers


def test_every_test_asserts_something():
    trees = {path: ast.parse(path.read_text()) for path in sorted(TESTS.rglob("*.py"))}
    helpers = _checking_helpers(list(trees.values()))
    unchecked = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            source = ast.unparse(node)
            called = {
                call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
                for call in ast.walk(node)
                if isinstance(call, ast.Call)
            }
            if "assert" in source or "raises" in source or called & helpers:
                continue
            if node.name not in CHECKED_ELSEWHERE:
                unchecked.append(f"{path.name}::{node.name}")
    assert not unchecked, f"these tests check nothing that could fail: {unchecked}"
