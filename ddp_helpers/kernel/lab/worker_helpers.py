"""Which package modules a worker needs, read from its imports: what a learner copies to take it away."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ddp_helpers.kernel.lab.source_view import PACKAGE_DIR, _resolve, display_or_print

PACKAGE = PACKAGE_DIR.name  # "ddp_helpers"


@dataclass(frozen=True)
class Helper:
    module: str  # "ddp_helpers.workers.train_report"
    names: tuple[str, ...]  # what the worker takes from it ("parse_args", ...); () for `import module`
    purpose: str  # the first sentence of the module's docstring


def module_path(module: str) -> Path:
    """The file of a module of this package, by its dotted name."""
    parts = module.split(".")[1:]
    folder = PACKAGE_DIR.joinpath(*parts)
    return folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")


def purpose(path: Path) -> str:
    """The first sentence of the module's docstring: its first paragraph, joined, up to the first ". "."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence = paragraph.split(". ")[0]
    return sentence if sentence.endswith(".") else sentence + "."


def package_imports(path: Path) -> dict[str, tuple[str, ...]]:
    """The modules of this package that the file at `path` imports, each with the names it takes."""
    taken: dict[str, list[str]] = {}
    for node in _loaded_with_the_file(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    taken.setdefault(alias.name, [])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] == PACKAGE
        ):
            for alias in node.names:
                # `from ddp_helpers.rank import teardown` names a module; `...rank.data import x`, a name in one
                if module_path(f"{node.module}.{alias.name}").is_file():
                    taken.setdefault(f"{node.module}.{alias.name}", [])
                else:
                    taken.setdefault(node.module, []).append(alias.name)
    return {name: tuple(names) for name, names in sorted(taken.items())}


def _loaded_with_the_file(body: list[ast.stmt]) -> list[ast.stmt]:
    """The import statements Python runs when it loads the file: its top level, into ``try`` and ``if``
    blocks but not ``if TYPE_CHECKING:``, and never into a function or a class (those import when called)."""
    found: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                found += _loaded_with_the_file(node.body)
            found += _loaded_with_the_file(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                found += _loaded_with_the_file(block)
    return found


def package_helpers(target: str | os.PathLike[str]) -> list[Helper]:
    """The ddp_helpers modules a worker (a bundled worker's name, or a file) imports itself."""
    return [
        Helper(module, names, purpose(module_path(module)))
        for module, names in package_imports(_resolve(target)).items()
    ]


# the file's top level, as torchrun runs it, without calling main(), in a fresh interpreter
_LOADS = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("copied_worker", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] == "ddp_helpers")))
"""


def closure(target: str | os.PathLike[str]) -> list[str]:
    """Every ddp_helpers module that loading the worker loads, sorted (its helpers, what they import in turn,
    and the packages on the way), as a fresh interpreter loads it."""
    command = [sys.executable, "-c", _LOADS, str(_resolve(target))]
    loaded = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    return list(json.loads(loaded.stdout.splitlines()[-1]))


def show_helpers(target: str | os.PathLike[str]) -> list[Helper]:
    """Show the table of `package_helpers(target)` (a markdown table in IPython, else text); return them."""
    helpers = package_helpers(target)
    name = _resolve(target).name
    rows = [
        f"| `{h.module}` | {', '.join(f'`{n}`' for n in h.names) or '(the module)'} | {h.purpose} |"
        for h in helpers
    ]
    needed = closure(target)
    text = "\n".join(
        [
            f"`{name}` imports {len(helpers)} module(s) of `{PACKAGE}`:",
            "",
            "| module | what it takes | what the module does |",
            "|---|---|---|",
            *rows,
            "",
            f"With what those import in turn, loading `{name}` loads {len(needed)} module(s) of the package: "
            + ", ".join(f"`{m.removeprefix(PACKAGE + '.')}`" for m in needed if m != PACKAGE)
            + ". A copy taken out of the workbench needs them too.",
        ]
    )
    # the table in a notebook, the same text where only plain text shows (a terminal IPython)
    display_or_print(text, lambda shown: {"text/markdown": text, "text/plain": text})
    return helpers
