"""Follow the per-rank log files that torchrun writes with ``--redirects 3 --log-dir``.

Each rank writes to its own files, so lines from two ranks can never merge into one,
and every line stays on disk after the run.
Layout (torch >= 2.0): ``<log_dir>/<run_id>_<rand>/attempt_<k>/<local_rank>/{stdout,stderr}.log``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_LOG_PATH = re.compile(r"attempt_(?P<attempt>\d+)/(?P<local_rank>\d+)/(?P<stream>stdout|stderr)\.log$")


@dataclass
class LogLine:
    rank: int
    attempt: int
    stream: str  # "stdout" or "stderr"
    text: str


@dataclass
class _FollowedFile:
    path: Path
    rank: int
    attempt: int
    stream: str
    offset: int = 0
    partial: bytes = b""


@dataclass
class RankLogTail:
    """Reads new complete lines from every rank's log files, in the order the files grow."""

    log_dir: Path
    rank_offset: int = 0  # global rank of local rank 0 (node_rank * nproc), until the workers tell
    _files: dict[Path, _FollowedFile] = field(default_factory=dict)
    _global_rank: dict[int, int] = field(default_factory=dict)  # local rank -> global rank, as seen

    def learn_ranks(self, local_to_global: dict[int, int]) -> None:
        """Record the global ranks the workers really got (a c10d rendezvous may order nodes its own way)."""
        self._global_rank.update(local_to_global)

    def global_rank(self, local_rank: int) -> int:
        return self._global_rank.get(local_rank, self.rank_offset + local_rank)

    def _discover(self) -> None:
        for path in self.log_dir.glob("*/attempt_*/*/std*.log"):
            if path in self._files:
                continue
            match = _LOG_PATH.search(path.as_posix())
            if match:
                self._files[path] = _FollowedFile(
                    path=path,
                    rank=int(match["local_rank"]),  # local here; made global when read
                    attempt=int(match["attempt"]),
                    stream=match["stream"],
                )

    def attempts(self) -> int:
        """How many attempts (restarts + 1) have produced log files so far."""
        return len({f.attempt for f in self._files.values()})

    def read_new(self, final: bool = False) -> list[LogLine]:
        """Complete lines written since the last call. With `final`, a trailing partial line too."""
        self._discover()
        lines: list[LogLine] = []
        for followed in sorted(self._files.values(), key=lambda f: (f.attempt, f.rank, f.stream)):
            try:
                with open(followed.path, "rb") as fh:
                    fh.seek(followed.offset)
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            followed.offset += len(chunk)
            data = followed.partial + chunk
            *complete, followed.partial = data.split(b"\n")
            if final and followed.partial:
                complete.append(followed.partial)
                followed.partial = b""
            for raw in complete:
                text = raw.decode("utf-8", errors="replace").rstrip("\r")
                # tqdm-style carriage-return updates: keep only what would be visible.
                text = text.rsplit("\r", 1)[-1]
                lines.append(
                    LogLine(self.global_rank(followed.rank), followed.attempt, followed.stream, text)
                )
        return lines

    def rank_file(self, rank: int, name: str, attempt: int | None = None) -> Path | None:
        """`name` (error.json, stderr.log, ...) of `rank` in the given attempt, or the latest one."""
        local = next((lr for lr, gr in self._global_rank.items() if gr == rank), rank - self.rank_offset)
        found = {}
        for path in self.log_dir.glob(f"*/attempt_*/{local}/{name}"):
            found[int(path.parent.parent.name.removeprefix("attempt_"))] = path
        if attempt is not None:
            return found.get(attempt)
        return found[max(found)] if found else None
