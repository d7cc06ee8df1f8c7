"""The training worker several chapters share (train.py and its parts); `worker_path` finds it, or a
chapter's script, by name."""

import re
from pathlib import Path

WORKERS_DIR = Path(__file__).parent
CHAPTERS_DIR = WORKERS_DIR.parent / "chapters"
CHAPTER_OWN = re.compile(r"ch\d\d_|__init__")  # a chapter's plan, views and exercises; not scripts


def worker_scripts() -> dict[str, Path]:
    """Every file that may be a script, by name: not an __init__, nor a chapter's own chNN_* modules."""
    found = {}
    for path in [*WORKERS_DIR.glob("*.py"), *CHAPTERS_DIR.glob("ch*/*.py")]:
        if not CHAPTER_OWN.match(path.name):
            found[path.stem] = path
    return found


def worker_path(name: str) -> Path:
    """The path of a bundled worker, by name ("train") or file name ("train.py")."""
    scripts = worker_scripts()
    stem = name.removesuffix(".py")
    if stem not in scripts:
        raise FileNotFoundError(f"no bundled worker {name!r}; available: {', '.join(sorted(scripts))}")
    return scripts[stem]
