"""Follow files other processes append to: `FileFollower` (one file, part lines held, ``\\r`` redraws kept as a
terminal shows them) and `RankLogTail` (torchrun's ``--redirects 3 --log-dir`` per-rank files)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_LOG_PATH = re.compile(r"attempt_(?P<attempt>\d+)/(?P<local_rank>\d+)/(?P<stream>stdout|stderr)\.log$")


def visible_text(line: str) -> str:
    """What a terminal shows for one line: the text after its last carriage return."""
    return line.rstrip("\r").rsplit("\r", 1)[-1]


@dataclass
class FileRead:
    lines: list[str]  # complete lines, in order
    partial: str | None  # the visible text of the line still being written, if it changed
    nbytes: int  # bytes read: any byte is a sign of life


@dataclass
class FileFollower:
    """Reads what was appended to one file since the last call."""

    path: Path
    offset: int = 0
    _pending: bytes = b""
    _pending_unshown: bool = False  # a part line read together with whole ones, not reported yet

    def read(self, final: bool = False) -> FileRead:
        """New complete lines; with `final`, a trailing partial line counts as complete."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return FileRead([], None, 0)
        self.offset += len(chunk)
        data = self._pending + chunk
        cut = data.rfind(b"\n")
        if final:
            cut = len(data) if data and cut < len(data) - 1 else cut
        # decode the complete lines at once (a flood is 100,000s of lines); a partial line stays bytes,
        # so a character split across two reads is whole when decoded
        complete, self._pending = (data[:cut], data[cut + 1 :]) if cut >= 0 else (b"", data)
        text = complete.decode("utf-8", errors="replace") if cut >= 0 else ""
        lines = text.split("\n") if cut >= 0 else []
        if "\r" in text:  # tqdm-style redraws: keep only what a terminal would show
            lines = [visible_text(line) for line in lines]
        # A part line read together with whole ones is most likely a line torn mid-write: it waits a read.
        # If the next read brings nothing, the line stays unfinished (a prompt, a bar): it is reported then.
        partial = None
        if self._pending and (chunk and not lines or not chunk and self._pending_unshown):
            partial = visible_text(self._pending.decode("utf-8", errors="replace"))
        self._pending_unshown = bool(self._pending and chunk and lines)
        return FileRead(lines, partial or None, len(chunk))


@dataclass
class LogChunk:
    """What one rank file gained since the last read: handled as a batch (a flood is 100,000s of lines)."""

    rank: int  # global rank (-1 until known)
    attempt: int
    stream: str
    lines: list[str]  # complete lines
    partial: str | None = None  # the visible text of the line still being written, if it changed


@dataclass
class _RankFile:
    follower: FileFollower
    local_rank: int
    attempt: int
    stream: str


@dataclass
class RankLogTail:
    """Reads new lines from every rank's log files, in the order the files grow."""

    log_dir: Path
    rank_offset: int = 0
    ranks_known_up_front: bool = True  # False across nodes: c10d decides, a rank's lines wait for learn_ranks
    _files: dict[Path, _RankFile] = field(default_factory=dict)
    _global_rank: dict[int, int] = field(default_factory=dict)  # local rank -> global rank, as seen
    _waiting: list[tuple[int, LogChunk]] = field(default_factory=list)  # (local rank, chunk) not yet mapped

    def learn_ranks(self, local_to_global: dict[int, int]) -> None:
        """Record the global ranks the workers really got (from their RANK environment variable)."""
        self._global_rank.update(local_to_global)

    def knows(self, local_rank: int) -> bool:
        return self.ranks_known_up_front or local_rank in self._global_rank

    def global_rank(self, local_rank: int) -> int:
        return self._global_rank.get(local_rank, self.rank_offset + local_rank)

    def global_ranks(self, nproc: int) -> list[int]:
        """The global ranks of this node's `nproc` workers, as far as they are known."""
        return [self.global_rank(local) for local in range(nproc)]

    def _discover(self) -> None:
        for path in self.log_dir.glob("*/attempt_*/*/std*.log"):
            if path in self._files:
                continue
            match = _LOG_PATH.search(path.as_posix())
            if match:
                self._files[path] = _RankFile(
                    FileFollower(path), int(match["local_rank"]), int(match["attempt"]), match["stream"]
                )

    def started(self) -> bool:
        """Whether any worker has started (its log files exist)."""
        self._discover()
        return bool(self._files)

    def attempts(self) -> int:
        """How many attempts (restarts + 1) have produced log files so far."""
        return len({f.attempt for f in self._files.values()})

    def read_chunks(self, final: bool = False) -> list[LogChunk]:
        """What every rank file gained since the last call, one chunk per file, in file order."""
        self._discover()
        # stdout before stderr: a rank that prints and then dies within one read has its lines shown
        # before its traceback (the files carry no times; a crash's traceback is what comes last)
        order = sorted(self._files.values(), key=lambda f: (f.attempt, f.local_rank, f.stream != "stdout"))
        for followed in order:
            read = followed.follower.read(final)
            if read.lines or read.partial is not None:
                chunk = LogChunk(-1, followed.attempt, followed.stream, read.lines, read.partial)
                self._waiting.append((followed.local_rank, chunk))
        ready = [(local, chunk) for local, chunk in self._waiting if self.knows(local) or final]
        self._waiting = [waiting for waiting in self._waiting if waiting not in ready]
        for local, chunk in ready:
            chunk.rank = self.global_rank(local)
        return [chunk for _, chunk in ready]

    def rank_file(self, rank: int, name: str) -> Path | None:
        """`name` (error.json, stderr.log, ...) of global `rank` in its latest attempt."""
        local = next((lr for lr, gr in self._global_rank.items() if gr == rank), rank - self.rank_offset)
        found = {
            int(p.parent.parent.name.removeprefix("attempt_")): p
            for p in self.log_dir.glob(f"*/attempt_*/{local}/{name}")
        }
        return found[max(found)] if found else None
