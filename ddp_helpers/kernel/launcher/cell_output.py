"""What a launch shows in the cell: the ranks' lines, rate-limited (Jupyter's IOPub limit) and written whole,
the progress bar, and a cell magic's code numbered as the editor numbers it. Every line stays in the logs."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm as text_tqdm

_WRITE_LOCK = threading.Lock()
# What one cell can take: Jupyter's default IOPub limits are 1000 messages/s and 1 MB/s.
LINES_PER_S = 100.0
BURST_LINES = 1000
HELD_REPORT_EVERY_S = 5.0
LIVE_EVERY_S = 1.0  # at most one live (\r) update per rank per second
MAX_LINE_CHARS = 1000  # x BURST_LINES: at most about 1 MB in a burst, Jupyter's IOPub limit per second


def shown_text(text: str, limit: int = MAX_LINE_CHARS, whole: str = "the whole line is in the log") -> str:
    """`text`, cut to `limit` characters with a note of its length and where `whole` it is."""
    return text if len(text) <= limit else f"{text[:limit]} ... ({len(text):,} characters; {whole})"


def write_line(text: str, stderr: bool = False) -> None:
    """Write `text` and its newline in one call, under a lock shared by every launch in this process."""
    stream = sys.stderr if stderr else sys.stdout
    with _WRITE_LOCK:
        stream.write(text + "\n")
        stream.flush()


@dataclass
class _Held:
    count: int = 0
    latest: str = ""


@dataclass
class CellEcho:
    """The cell's view of a launch's output; `write` is how a line reaches the cell (the progress bar's)."""

    where: str  # where every line is kept, for the "held back" note ("result.logs and under <where>")
    write: Callable[[str, bool], None] = write_line
    lines_per_s: float = LINES_PER_S
    burst: int = BURST_LINES
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(init=False)
    _refilled: float = field(init=False)
    _held: dict[str, _Held] = field(default_factory=dict)
    held_back: int = 0  # lines not shown in the cell (live ranks: in this cell)
    _last_report: float = field(init=False)
    _live: dict[str, tuple[float, str]] = field(default_factory=dict)  # when and what a part line last showed
    kept_in: str = ""  # overrides the note's "result.logs and under <where>"

    def __post_init__(self) -> None:
        self._tokens = float(self.burst)
        self._refilled = self._last_report = self.clock()

    def lines(self, label: str, texts: list[str], stderr: bool = False) -> None:
        """Complete lines from `label`: as many as the rate allows are shown, the rest held back."""
        if not texts:
            return
        if self._live.pop(label, (0.0, None))[1] == texts[0]:
            texts = texts[1:]  # the line was shown whole while it waited for its newline: not twice
            if not texts:
                return
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._refilled) * self.lines_per_s)
        self._refilled = now
        # once a source has lines held back, its later lines wait for the report too: lines stay in order
        shown = 0 if label in self._held else min(len(texts), int(self._tokens))
        self._tokens -= shown
        for text in texts[:shown]:
            self.write(f"[{label}] {shown_text(text)}", stderr)
        if shown < len(texts):
            held = self._held.setdefault(label, _Held())
            held.count += len(texts) - shown
            held.latest = shown_text(texts[-1])
            self.held_back += len(texts) - shown

    def live(self, label: str, text: str, stderr: bool = False) -> None:
        """A line still being written (a progress bar's ``\\r`` update): shown now and then, never held back."""
        now = self.clock()
        if label in self._held:
            return  # its report will show the latest line
        if now - self._live.get(label, (-LIVE_EVERY_S, ""))[0] >= LIVE_EVERY_S:
            self._live[label] = (now, text)
            self.write(f"[{label}] {shown_text(text)}", stderr)  # tqdm draws on stderr: so do its updates

    def tick(self) -> None:
        """Every few seconds while lines are held back: each source's latest line and the count."""
        if self._held and self.clock() - self._last_report >= HELD_REPORT_EVERY_S:
            self._report()

    def _report(self) -> None:
        for label, held in sorted(self._held.items()):
            self.write(f"[{label}] {held.latest}   ({held.count} lines held back)", False)
        self._held.clear()
        self._last_report = self.clock()
        self.write(
            f"[ddp_helpers] {self.held_back} lines so far printed faster than a cell can show; "
            f"every line is kept in {self.kept_in or f'result.logs and under {self.where}'}",
            False,
        )

    def close(self) -> None:
        """The end of the output (a run, or one live-ranks cell): each held source's last line and count."""
        if self._held:
            self._report()


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
    except (AttributeError, ValueError):  # not a file, or a closed one
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


class CellSyntaxError(Exception):
    """A cell that does not compile, shown as Python shows a SyntaxError (not with the magic's call stack)."""

    def __init__(self, error: SyntaxError) -> None:
        self.error = error
        super().__init__(str(error))

    def _render_traceback_(self) -> list[str]:
        return "".join(traceback.format_exception_only(type(self.error), self.error)).rstrip().splitlines()
