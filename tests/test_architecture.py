"""The package's sides, checked: what runs in a rank never imports what runs in the kernel.

docs/architecture.md draws the sides. A worker pays nothing for the launcher, and a rank never loads
the code that starts, watches or plots runs; the launcher never depends on the lab (the displays).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ddp_helpers"

# Modules that run inside a rank (under torchrun): the top-level modules, the bundled workers, and
# live ranks' server end with the protocol both ends share.
EXERCISES_RANK_SIDE = ("__init__", "spec", "registry", "lines", "observers", "rank_side")
RANK_SIDE_TOP = ("backends", "checkpoint", "data", "distributed", "errors", "metrics", "teardown")
RANK_SIDE = (
    [PACKAGE / f"{name}.py" for name in RANK_SIDE_TOP]
    + sorted((PACKAGE / "workers").glob("*.py"))
    + [PACKAGE / "live" / f"{name}.py" for name in ("server", "protocol", "rank_debug", "rank_call")]
    + [PACKAGE / "worker_site" / "sitecustomize.py"]  # runs in every rank before its script
    # an exercise's answer runs on the live ranks: the catalogue, its probes and the rank's runner
    + [PACKAGE / "exercises" / f"{name}.py" for name in EXERCISES_RANK_SIDE]
    + sorted((PACKAGE / "exercises").glob("nb[0-9][0-9].py"))
    + sorted((PACKAGE / "exercises").glob("nb[0-9][0-9]/*.py"))  # a notebook's exercises, one file each
)
KERNEL_SIDE = (
    "ddp_helpers.launcher",
    "ddp_helpers.lab",
    *(f"ddp_helpers.exercises.{name}" for name in ("checker", "verdict", "magics", "cli", "capstone")),
)
LIVE_RANK_END = (
    "ddp_helpers.live.server",
    "ddp_helpers.live.protocol",
    "ddp_helpers.live.rank_debug",
    "ddp_helpers.live.rank_call",  # LiveRanks.call's `invoke` runs in every rank
)  # the rest of live/ is the kernel's end


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


def is_kernel_side(module: str) -> bool:
    if module.startswith("ddp_helpers.live."):
        return not any(module == end or module.startswith(end + ".") for end in LIVE_RANK_END)
    return any(module == side or module.startswith(side + ".") for side in KERNEL_SIDE)


@pytest.mark.parametrize("path", RANK_SIDE, ids=lambda p: module_name(p))
def test_a_rank_side_module_imports_nothing_of_the_kernel_side(path):
    assert path.is_file(), path
    kernel = sorted(m for m in imported_modules(path) if is_kernel_side(m))
    assert not kernel, f"{module_name(path)} runs in a rank but imports {kernel}"


def test_the_launcher_does_not_depend_on_the_lab():
    for path in sorted((PACKAGE / "launcher").glob("*.py")):
        lab = sorted(m for m in imported_modules(path) if m.startswith("ddp_helpers.lab"))
        assert not lab, f"{module_name(path)} imports {lab}"


def test_the_check_sees_kernel_imports_however_they_are_written():
    # the checks above must be able to fail: relative, nested and absolute imports are all resolved
    source = (
        "from .launcher.runner import launch\n"
        "def f():\n    from . import lab\n"
        "import ddp_helpers.live.ranks\n"
        "from ..live import magics\n"
    )
    found = {m for m in imports_in(source, "ddp_helpers.live.server") if is_kernel_side(m)}
    assert {"ddp_helpers.live.ranks", "ddp_helpers.live.magics"} <= found  # absolute, and ..live
    found = {m for m in imports_in(source, "ddp_helpers.teardown") if is_kernel_side(m)}
    assert {"ddp_helpers.launcher.runner", "ddp_helpers.lab", "ddp_helpers.live.ranks"} <= found


def test_importing_the_rank_side_loads_no_kernel_module():
    # what a worker really loads: torch aside, nothing of the launcher, the lab or the live kernel end
    names = ", ".join(f"ddp_helpers.{name}" for name in RANK_SIDE_TOP)
    code = (
        f"import sys, {names}, ddp_helpers.live.server\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('ddp_helpers'))))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    kernel = [m for m in loaded if is_kernel_side(m)]
    assert not kernel, kernel
    assert "ddp_helpers.live.server" in loaded


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
