"""`RunFollower`: one launch in progress, seen from its files. It echoes each rank's lines, tracks progress,
and turns a silence or an exit into an error that names the rank and why; it starts and stops nothing."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ddp_helpers.errors import LaunchError, LaunchFailed, LaunchTimeout, WorkerFailed
from ddp_helpers.kernel.launcher.cell_output import CellEcho, StepProgress, resolve_progress
from ddp_helpers.kernel.launcher.config import LaunchConfig
from ddp_helpers.kernel.launcher.diagnosis import destroy_deadlock_note, diagnose, strip_rank_prefix
from ddp_helpers.kernel.launcher.log_follow import FileFollower, LogChunk, RankLogTail
from ddp_helpers.kernel.launcher.resources import full_disk_note
from ddp_helpers.rank.metrics import METRICS_DIR, PLAN_FILE


class MetricsFollower:
    """Reads new lines of every rank's metrics file as they are appended."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.metrics_dir = Path(run_dir) / METRICS_DIR
        self.plan_path = Path(run_dir) / PLAN_FILE
        self._files: dict[Path, FileFollower] = {}

    def read_new(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for path in sorted(self.metrics_dir.glob("rank*.jsonl")):
            for line in self._files.setdefault(path, FileFollower(path)).read().lines:  # a part line waits
                with contextlib.suppress(json.JSONDecodeError):
                    records.append(json.loads(line))
        return records

    def total_steps(self) -> int | None:
        try:
            return int(json.loads(self.plan_path.read_text())["total_steps"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


@dataclass
class _RankState:
    last_heard: float | None = None
    last_line: str = ""
    last_step: int | None = None


class RunFollower:
    """One launch in progress; as a context manager it closes the echo and the progress bar at the end."""

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.tail = RankLogTail(
            config.log_dir, rank_offset=config.rank_offset, ranks_known_up_front=config.nnodes == 1
        )
        self.agent = FileFollower(config.agent_log)
        self.follower = MetricsFollower(config.out_dir)
        self.progress = StepProgress(resolve_progress(config.progress), config.script.name)
        self.echo = CellEcho(where=str(config.log_dir), write=self.progress.write)
        # on one node the ranks are known up front; across nodes the rendezvous decides
        expected = range(config.local_world_size) if config.nnodes == 1 else ()
        self.ranks = {r: _RankState() for r in expected}
        self.logs: dict[int, list[str]] = {r: [] for r in self.ranks}
        self.agent_lines: list[str] = []
        self.attempts_seen = 0
        self.started = time.monotonic()
        self.last_progress = self.started
        self.heard_any = False  # any byte from a rank, or a metrics line
        self.last_waiting_note = self.started
        self.label_note = ""  # live ranks: e.g. " (after cell 3)", for lines printed between cells

    def __enter__(self) -> RunFollower:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.echo.close()
        self.progress.close(kind is None)

    def on_rank_output(self, chunk: LogChunk) -> None:
        now = time.monotonic()
        state = self.ranks.setdefault(chunk.rank, _RankState())
        state.last_heard = now
        self.last_progress, self.heard_any = now, True
        show = self.config.show_ranks  # "all", "none" or a list of ranks, once checked
        shown = show == "all" or (isinstance(show, list) and chunk.rank in show)
        label = (
            f"rank {chunk.rank}" + (f" (restart {chunk.attempt})" if chunk.attempt else "") + self.label_note
        )
        if chunk.lines:
            state.last_line = chunk.lines[-1]
            self.logs.setdefault(chunk.rank, []).extend(chunk.lines)
            if shown:  # the label already says which rank: torch's own "[rankN]: " prefix would repeat it
                texts = [strip_rank_prefix(t) if t.startswith("[rank") else t for t in chunk.lines]
                self.echo.lines(label, texts, stderr=chunk.stream == "stderr")
        if chunk.partial is not None:
            state.last_line = chunk.partial
            if shown:  # a progress bar redrawing its line: alive, and shown now and then, on its own stream
                self.echo.live(label, chunk.partial, stderr=chunk.stream == "stderr")

    def on_metrics(self, records: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        for record in records:
            rank = record.get("rank")
            if isinstance(rank, int):
                state = self.ranks.setdefault(rank, _RankState())
                state.last_heard = now
                state.last_step = record.get("step", state.last_step)
        self.last_progress, self.heard_any = now, True
        lead = [r for r in records if r.get("rank") == min(self.tail.global_ranks(1)) and "step" in r]
        if lead:
            latest = lead[-1]
            postfix = {"loss": f"{latest['loss']:.4f}"} if isinstance(latest.get("loss"), int | float) else {}
            self.progress.update(int(latest["step"]), self.follower.total_steps(), **postfix)

    def poll_files(self, final: bool = False) -> None:
        # torchrun's own lines are kept but not echoed: its warnings would come before the clear error;
        # when they are the only explanation, the LaunchFailed message carries them
        read = self.agent.read(final)
        self.agent_lines += read.lines
        if read.nbytes:
            self.last_progress = time.monotonic()
        chunks = self.tail.read_chunks(final=final)
        attempts = self.tail.attempts()  # of the files just read
        for chunk in chunks:
            self.on_rank_output(chunk)
        records = self.follower.read_new()
        if records:
            self.on_metrics(records)
        if attempts > max(self.attempts_seen, 1):
            self.echo.write(
                f"[torchrun] restart {attempts - 1} of {self.config.max_restarts}: workers restarted", False
            )
        self.attempts_seen = max(self.attempts_seen, attempts)
        self.echo.tick()

    def hang_report(self, alive_ranks: set[int], stacks: dict[int, str] | None = None) -> LaunchTimeout:
        """The error for a hung run: each rank's state and, from `stacks`, where a live one waits."""
        now = time.monotonic()
        stacks = stacks or {}
        rows, silent = [], []
        for rank, state in sorted(self.ranks.items()):
            heard = (
                f"last heard {now - state.last_heard:.1f}s ago" if state.last_heard else "never heard from"
            )
            status = "running" if rank in alive_ranks else "exited"
            step = f", last step {state.last_step}" if state.last_step is not None else ""
            line = f", last line: {state.last_line[:120]!r}" if state.last_line else ""
            rows.append(f"  rank {rank}: {status}, {heard}{step}{line}")
            if rank in stacks:
                rows.append("    waits in (innermost call first):")
                rows += [f"      {frame}" for frame in stacks[rank].splitlines()]
            if state.last_heard is None or now - state.last_heard >= (self.config.timeout or 0):
                silent.append(rank)
        nccl = " and 'NCCL_DEBUG': 'INFO'" if self.config.backend == "nccl" else ""
        advice = [
            ""
            if self.heard_any
            else "No rank printed anything: a slow start may need a longer startup_timeout.",
            destroy_deadlock_note(stacks, self.config.backend, importlib.metadata.version("torch")),
            f"To find the collective that does not match, rerun with env={{'TORCH_DISTRIBUTED_DEBUG': 'DETAIL'}}{nccl}.",
            "A rank that exited while others still run usually means uneven inputs or a skipped collective.",
        ]
        message = (
            f"the run hung: no output and no metrics for {self.config.timeout:g}s, so every process was stopped "
            f"(SIGTERM, then SIGKILL after {self.config.grace_s:g}s).\n"
            f"silent ranks: {', '.join(map(str, silent)) or 'none'}\n"
            + "\n".join(rows)
            + "\n"
            + "\n".join(filter(None, advice))
        )
        return LaunchTimeout(message, silent_ranks=silent, run_dir=str(self.config.out_dir), stacks=stacks)

    def failure(self, returncode: int, stderr_since: dict[int, int] | None = None) -> LaunchError:
        """The error for a run that ended with `returncode`; `stderr_since`: each rank's stderr offset (live)."""
        agent_output = "\n".join(self.agent_lines)
        # without an agent there is no torchrun report: the one process's own exit code is the rank's
        known = {self.config.rank_offset: returncode} if self.config.launcher == "python" else None
        diagnosis = diagnose(
            agent_output,
            self.tail,
            self.config.local_world_size,
            cuda_available=self.config.gpus > 0,
            exitcodes=known,
            stderr_since=stderr_since,
        )
        if diagnosis is None and "RendezvousTimeoutError" in agent_output:
            message = (
                f"the rendezvous timed out: not all {self.config.nnodes} nodes joined at "
                f"{self.config.rdzv_endpoint} within {self.config.rdzv_timeout:g}s, so no worker started. Start "
                "every node with the same rdzv_endpoint and nnodes; the first node's port must be reachable."
            )
        elif diagnosis is None:
            message = (
                f"{self.config.launcher} exited with code {returncode} before any worker reported an error."
                f"{full_disk_note(self.config.out_dir)}\n" + "\n".join(self.agent_lines[-30:])
            )
        if diagnosis is None:
            return LaunchFailed(message, returncode=returncode, output=agent_output)
        headline, title = "", "root-cause traceback:"
        if diagnosis.left_early:  # the cause: ranks that left while this one still waited; say when
            gone = []
            for rank in diagnosis.left_early:
                state, last = self.ranks.get(rank, _RankState()), ""
                if state.last_heard is not None:
                    last = f", its last line {state.last_heard - self.started:.1f}s in"
                    last += f": {state.last_line[:80]!r}" if state.last_line else ""
                gone.append(f"rank {rank} exited with code 0{last}")
            headline = (
                f"rank {diagnosis.rank} failed because {'; '.join(gone)}, while rank {diagnosis.rank} still "
                f"waited in a collective. Rank {diagnosis.rank}'s error: {diagnosis.error.splitlines()[0][:160]}"
            )
            title = f"rank {diagnosis.rank}'s traceback (the collective it waited in):"
        return WorkerFailed(
            diagnosis.rank,
            diagnosis.exitcode,
            diagnosis.error,
            diagnosis.traceback,
            hint=diagnosis.hint,
            run_dir=str(self.config.out_dir),
            logs=self.logs,
            stderr_tail=diagnosis.stderr_tail,
            headline=headline,
            traceback_title=title,
            left_early=diagnosis.left_early,
        )
