"""Which package modules a worker imports at its top level, read with `ast`: what a learner copies with it
to take it away (``show_helpers("train")``); ``ddp.py`` imports only torch."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

from ddp_helpers.kernel.lab.source_view import PACKAGE_DIR, _resolve, display_or_print

PACKAGE = PACKAGE_DIR.name  # "ddp_helpers"


@dataclass(frozen=True)
class Helper:
    module: str  # "ddp_helpers.workers.train_report"
    names: tuple[str, ...]  # what the worker takes from it ("parse_args", ...); () for a module itself
    purpose: str  # the first sentence of the module's docstring


def module_path(module: str) -> Path:
    folder = PACKAGE_DIR.joinpath(*module.split(".")[1:])
    return folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")


def purpose(path: Path) -> str:
    """The first sentence of the module's docstring, its lines joined."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    sentence = " ".join(doc.split("\n\n")[0].split()).split(". ")[0]
    return sentence if sentence.endswith(".") else sentence + "."


def package_imports(path: Path) -> dict[str, tuple[str, ...]]:
    """The package's modules the file imports at its top level (absolute imports), with the names it takes."""
    taken: dict[str, list[str]] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    taken.setdefault(alias.name, [])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(PACKAGE):
            for alias in node.names:
                # `from ddp_helpers.rank import teardown` names a module; `...rank.data import x`, a name in one
                if module_path(f"{node.module}.{alias.name}").is_file():
                    taken.setdefault(f"{node.module}.{alias.name}", [])
                else:
                    taken.setdefault(str(node.module), []).append(alias.name)
    return {name: tuple(names) for name, names in sorted(taken.items())}


def package_helpers(target: str | os.PathLike[str]) -> list[Helper]:
    """The ddp_helpers modules a worker (a bundled worker's name, or a file) imports itself."""
    imports = package_imports(_resolve(target))
    return [Helper(module, names, purpose(module_path(module))) for module, names in imports.items()]


def show_helpers(target: str | os.PathLike[str]) -> list[Helper]:
    """Show the table of `package_helpers(target)` (markdown in IPython, text elsewhere); return them."""
    helpers = package_helpers(target)
    rows = [
        f"| `{h.module}` | {', '.join(f'`{n}`' for n in h.names) or '(the module)'} | {h.purpose} |"
        for h in helpers
    ]
    header = f"`{_resolve(target).name}` imports {len(helpers)} module(s) of `{PACKAGE}`, which a copy needs:"
    text = "\n".join(
        [header, "", "| module | what it takes | what the module does |", "|---|---|---|", *rows]
    )
    display_or_print(text, lambda shown: {"text/markdown": text, "text/plain": text})
    return helpers
