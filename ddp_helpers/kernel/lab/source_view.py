"""Show the learner the code that runs, by function or class name rather than by text anchors, and which
package modules a worker imports at its top level: what a copy of it needs (``show_helpers("train")``)."""

from __future__ import annotations

import ast
import difflib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddp_helpers.workers import worker_path

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # ddp_helpers/


def _resolve(target: str | os.PathLike[str]) -> Path:
    candidate = Path(target)
    if candidate.suffix == ".py" and candidate.is_file():
        return candidate
    try:
        return worker_path(str(target))
    except FileNotFoundError:
        # a module of this package by its name ("checkpoint": file names are unique in the package) or
        # by its dotted path below the package ("rank.live_server")
        if isinstance(target, str) and all(part.isidentifier() for part in target.split(".")):
            module = PACKAGE_DIR.joinpath(*target.split(".")).with_suffix(".py")
            if module.is_file():
                return module
            found = sorted(PACKAGE_DIR.rglob(f"{target}.py"))
            if len(found) == 1:
                return found[0]
        raise


Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _find(tree: ast.Module, dotted: str) -> Definition:
    node: ast.AST = tree
    for name in dotted.split("."):
        found = [c for c in ast.iter_child_nodes(node) if isinstance(c, Definition) and c.name == name]
        if not found:
            raise LookupError(f"no function or class named {dotted!r} (missing: {name!r})")
        node = found[0]
    assert isinstance(node, Definition)
    return node


def source_of(target: str | os.PathLike[str], *names: str) -> str:
    """The source of each named function or class in `target` (decorators included), or the whole file."""
    path = _resolve(target)
    text = path.read_text()
    if not names:
        return text
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    parts = []
    for name in names:
        node = _find(tree, name)
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        parts.append("\n".join(lines[first - 1 : node.end_lineno]))
    return "\n\n".join(parts)


def display_or_print(text: str, rich: Callable[[Any], Any] | None = None) -> None:
    """In a notebook, display `rich(IPython.display)` (an object, or a mimebundle dict); elsewhere print `text`."""
    try:
        from IPython import display as ipython_display
        from IPython import get_ipython
    except ImportError:
        get_ipython = None  # noqa: N806
    if rich is None or get_ipython is None or get_ipython() is None:
        print(text)
    else:
        shown = rich(ipython_display)
        ipython_display.display(shown, raw=isinstance(shown, dict))


def show_source(target: str | os.PathLike[str], *names: str) -> None:
    """Display `source_of(target, *names)` with syntax highlighting in a notebook (printed elsewhere)."""
    text = source_of(target, *names)
    display_or_print(text, lambda shown: shown.Code(text, language="python"))


def show_diff(old: str | os.PathLike[str], new: str | os.PathLike[str], context: int = 3) -> None:
    """Show two workers (or files) side by side with the changes marked; a unified diff outside IPython."""
    (a_path, b_path), n = (_resolve(old), _resolve(new)), context
    a, b = a_path.read_text().splitlines(), b_path.read_text().splitlines()
    table = difflib.HtmlDiff(wrapcolumn=80).make_table(
        a, b, a_path.name, b_path.name, context=True, numlines=n
    )
    unified = difflib.unified_diff(a, b, a_path.name, b_path.name, lineterm="", n=n)
    display_or_print("\n".join(unified), lambda shown: shown.HTML(_DIFF_STYLE + table))


# difflib's own colours, and a monospace font so the two columns line up
_DIFF_STYLE = """<style>
table.diff {font-family: monospace; font-size: 85%; border: none}
table.diff td {white-space: pre-wrap; padding: 0 4px}
.diff_add {background-color: #aaffaa} .diff_chg {background-color: #ffff77} .diff_sub {background-color: #ffaaaa}
.diff_header {color: #888} .diff_next {display: none}
</style>"""


PACKAGE = PACKAGE_DIR.name  # "ddp_helpers"


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


def show_helpers(target: str | os.PathLike[str]) -> dict[str, tuple[str, ...]]:
    """Show the package modules a worker imports, what it takes from each and what each does; return them."""
    imports = package_imports(_resolve(target))
    rows = [
        f"| `{module}` | {', '.join(f'`{n}`' for n in names) or '(the module)'} | {purpose(module_path(module))} |"
        for module, names in imports.items()
    ]
    header = f"`{_resolve(target).name}` imports {len(imports)} module(s) of `{PACKAGE}`, which a copy needs:"
    text = "\n".join(
        [header, "", "| module | what it takes | what the module does |", "|---|---|---|", *rows]
    )
    display_or_print(text, lambda shown: {"text/markdown": text, "text/plain": text})
    return imports
