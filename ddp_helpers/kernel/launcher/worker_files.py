"""Put a worker script where a run can use it, and show the learner the exact file that runs."""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

from ddp_helpers.workers import worker_path


def _line_number(lines: list[str], text: str, start: int = 1) -> int:
    """The 1-based number of the first line from `start` on that contains `text`."""
    found = (number for number, line in enumerate(lines[start - 1 :], start=start) if text in line)
    if (number := next(found, None)) is None:
        raise ValueError(f"no line contains {text!r}")
    return number


def _display_code(path: Path, highlight: tuple[str, str] | None) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import Code, display
    except ImportError:
        return
    if get_ipython() is None:
        return
    text = path.read_text()
    if highlight:
        lines = text.splitlines()
        first = _line_number(lines, highlight[0])
        last = _line_number(lines, highlight[1], start=first)
        text = "\n".join(lines[first - 1 : last])
    display(Code(text, language="python"))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _stamp(target: Path) -> Path:
    # beside each copy: the digest of what write_worker last wrote there, to tell an edit from an old copy
    return target.with_name(f".{target.name}.written")


def _edited_by_hand(target: Path, new_text: str) -> bool:
    """True when `target` holds text that neither `new_text` nor write_worker's last copy had."""
    current = target.read_text() if target.is_file() else new_text
    stamp = _stamp(target)
    written = stamp.read_text().strip() if stamp.is_file() else None
    return current != new_text and written != _digest(current)


def write_worker(
    worker: str | os.PathLike[str],
    directory: str | os.PathLike[str] = "runs/workers",
    *,
    source: str | None = None,
    show: bool = True,
    lines: tuple[str, str] | None = None,
) -> Path:
    """Copy a worker into `directory` and show it with syntax highlighting."""
    target_dir = Path(directory)
    target_dir.mkdir(parents=True, exist_ok=True)
    if source is not None:
        name = Path(worker).name
        target = target_dir / (name if name.endswith(".py") else f"{name}.py")
        text = source if source.endswith("\n") else source + "\n"
        _write(target, text)
    else:
        candidate = Path(worker)
        origin = candidate if candidate.suffix == ".py" and candidate.is_file() else worker_path(str(worker))
        target = target_dir / origin.name
        text = origin.read_text()
        if origin.resolve() == target.resolve():
            pass  # the packaged file itself: nothing to copy
        elif _edited_by_hand(target, text):
            warnings.warn(
                f"{target} was edited since it was written: keeping your version and running it. "
                f"The original is {origin}; delete your copy to have it written again.",
                stacklevel=2,
            )
        else:
            _write(target, text)
    if show:
        _display_code(target, lines)
    return target.resolve()


def _write(target: Path, text: str) -> None:
    target.write_text(text)
    _stamp(target).write_text(_digest(text) + "\n")
