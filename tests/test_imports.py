"""No import cycles in the package, and no worker loaded twice when it runs as a script.

A cycle works by luck of order (or under `TYPE_CHECKING` only), and it hides a worse fault: a worker
file run as ``python fsdp.py`` is the module ``__main__``; a helper that imports
``ddp_helpers.chapters.ch08_beyond_ddp.fsdp`` back loads the same file a second time, with a second copy of each of its
globals. Shared types live in a module of their own (``train_state``, ``fsdp_model``, ``live_protocol``).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from ddp_helpers.workers import worker_scripts

PACKAGE = Path(__file__).resolve().parent.parent / "ddp_helpers"
MODULES = {
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
    for path in sorted(PACKAGE.rglob("*.py"))
}


def package_imports(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that `module` imports, anywhere in its code: at the top, inside
    functions, under ``if TYPE_CHECKING``. ``from x import y`` counts as importing ``x.y`` when that
    is a module (``from ddp_helpers.workers import fsdp_checkpoint``), else as importing ``x``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return {name for name in found if name in known and name != module}


def import_graph() -> dict[str, set[str]]:
    known = set(MODULES)
    return {
        name: package_imports(path.read_text(), name, path.name == "__init__.py", known)
        for name, path in MODULES.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None (a depth-first search)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            following = next(stack[-1], None)
            if following is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif following in on_path:
                return path[path.index(following) :] + [following]
            elif following not in done:
                path.append(following)
                on_path.add(following)
                stack.append(iter(sorted(graph[following])))
    return None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])


def test_the_graph_sees_every_kind_of_import():
    # the test above must be able to fail: each way of writing an import is one edge
    known = {"p", "p.a", "p.b", "p.c", "p.sub", "p.sub.d", "p.e", "p.f"}
    source = (
        "import p.a\n"
        "from p import b\n"  # a module, imported from its package
        "from . import c\n"
        "from .sub import d\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .e import Thing\n"
        "def later():\n    from .f import other\n"
        "from . import not_a_module\n"  # a name of p's __init__: the package itself
        "import os\n"
    )
    assert package_imports(source, "p.x", False, known) == {"p", "p.a", "p.b", "p.c", "p.sub.d", "p.e", "p.f"}
    assert package_imports("from .. import a\n", "p.sub.d", False, known) == {"p.a"}
    assert package_imports("from .d import y\n", "p.sub", True, known) == {"p.sub.d"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


# One interpreter imports torch once, then forks a child per worker: each child runs its file as
# `__main__` with --help (argparse prints and exits; nothing trains), then reports what got loaded.
RUN_AS_MAIN = """
import json, os, runpy, sys
import torch  # shared by the children: each starts with torch imported and no ddp_helpers module

def run_as_main(path, answer):
    sys.argv = [path, "--help"]
    ended = "returned"
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exit:
        ended = f"SystemExit({exit.code!r})"
    except BaseException as error:
        ended = f"raised {error!r}"
    real = os.path.realpath(path)
    twice = sorted(
        name for name, module in list(sys.modules.items())
        if name != "__main__" and os.path.realpath(getattr(module, "__file__", None) or "") == real
    )
    os.write(answer, json.dumps({"path": path, "ended": ended, "twice": twice}).encode())

children = []
for path in sys.argv[1:]:  # all at once: a worker's own imports (fsdp's take seconds) overlap
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            # a child's --help would share the parent's stdout and could run into its RESULT lines
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            run_as_main(path, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    children.append((pid, read_end))
for pid, read_end in children:
    with os.fdopen(read_end, "rb") as answer:
        report = answer.read()
    os.waitpid(pid, 0)
    print("RESULT", report.decode(), flush=True)
"""


def test_a_worker_run_as_a_script_is_not_imported_again_by_its_helpers(tmp_path):
    scripts = [
        str(path)
        for path in sorted(worker_scripts().values())
        if 'if __name__ == "__main__":' in path.read_text()
    ]
    assert len(scripts) >= 5, scripts
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DDP_", "RANK", "LOCAL_", "WORLD_", "MASTER_", "TORCHELASTIC_", "GROUP_"))
    }
    env["DDP_RUN_DIR"] = str(tmp_path / "runs")  # a worker that writes anything writes it here
    out = subprocess.run(
        [sys.executable, "-c", RUN_AS_MAIN, *scripts],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
        check=True,
    ).stdout
    results = [
        json.loads(line.removeprefix("RESULT ")) for line in out.splitlines() if line.startswith("RESULT ")
    ]
    assert [r["path"] for r in results] == scripts, out[-2000:]
    # --help ends a worker before any work: argparse's exit (which torchelastic's @record turns into a
    # return), or sum_order's refusal to run outside torchrun; never an error
    failed = [f"{Path(r['path']).name}: {r['ended']}" for r in results if r["ended"].startswith("raised")]
    assert not failed, failed
    twice = {Path(r["path"]).name: r["twice"] for r in results if r["twice"]}
    assert not twice, f"run as __main__, these workers were imported again under their module name: {twice}"
