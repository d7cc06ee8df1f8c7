"""The progress bar a launch shows: a widget in JupyterLab, plain text under papermill and in a terminal."""

from __future__ import annotations

import os
import sys
from typing import Any

from tqdm import tqdm as text_tqdm

from .cell_output import write_line

PROGRESS_ENV = "DDP_HELPERS_PROGRESS"  # "widget", "text" or "off"; papermill runs set "text"


def resolve_progress(progress: str) -> str:
    """Turn "auto" into what this process can show: tqdm.auto's own choice, or the environment's."""
    if progress != "auto":
        return progress
    chosen = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if chosen in ("widget", "text", "off"):
        return chosen
    # tqdm.auto's own test: a Jupyter kernel with ipywidgets gets the widget bar, all else text
    from tqdm.auto import tqdm as auto_tqdm

    return "text" if auto_tqdm is text_tqdm else "widget"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class StepProgress:
    """A step counter that appears with the first metrics line and follows rank 0's step."""

    def __init__(self, kind: str, description: str) -> None:
        self.kind = kind
        self.description = description
        self.bar: Any = None

    def _make(self, total: int | None) -> Any:
        if self.kind == "widget":
            from tqdm.notebook import tqdm as widget_tqdm

            return widget_tqdm(total=total, desc=self.description, unit="step")
        return text_tqdm(total=total, desc=self.description, unit="step", file=sys.stderr, mininterval=1.0)

    def update(self, step: int, total: int | None, **postfix: Any) -> None:
        if self.kind == "off":
            return
        if self.bar is None:
            self.bar = self._make(total)
        if total is not None and self.bar.total != total:
            self.bar.total = total
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)

    def close(self, success: bool) -> None:
        if self.bar is None:
            return
        if self.kind == "widget" and not success:
            self.bar.colour = "#d9534f"  # the widget turns red, like tqdm's own on error
        self.bar.close()

    def write(self, text: str, stderr: bool = False) -> None:
        """Print a log line without tearing the text bar."""
        # In a terminal, tqdm.write lifts the bar out of the way; elsewhere (papermill) it only adds noise.
        if self.bar is not None and self.kind == "text" and _isatty(self.bar.fp):
            text_tqdm.write(text, file=sys.stderr if stderr else sys.stdout)
        else:
            write_line(text, stderr)  # whole, under a lock: two launches' lines never merge
