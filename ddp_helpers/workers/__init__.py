"""Standalone worker scripts. Each file runs under plain `python` and under `torchrun`."""

from pathlib import Path

WORKERS_DIR = Path(__file__).parent


def worker_path(name: str) -> Path:
    """The path of a bundled worker, by name ("train") or file name ("train.py")."""
    path = WORKERS_DIR / (name if name.endswith(".py") else f"{name}.py")
    if not path.is_file() or path.name == "__init__.py":
        available = sorted(p.stem for p in WORKERS_DIR.glob("*.py") if p.name != "__init__.py")
        raise FileNotFoundError(f"no bundled worker {name!r}; available: {', '.join(available)}")
    return path
