"""`launch()`: run a script under torchrun as a subprocess, watch it live, and never leave a process behind."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .errors import InvalidLaunchArguments, LaunchError, LaunchFailed, LaunchTimeout, WorkerFailed
from .failure import diagnose
from .launch_config import LaunchConfig, make_config, visible_gpus
from .log_tail import LogLine, RankLogTail
from .metrics import MetricsFollower, read_metrics, read_summary
from .process_tree import ProcessTree
from .progress import PROGRESS_CHOICES, StepProgress, resolve_progress
from .resources import ResourceSampler

if TYPE_CHECKING:  # pandas loads on first use: workers import this package and should not pay for it
    import pandas as pd

POLL_S = 0.1


def _empty_frame() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame()


@dataclass
class LaunchResult:
    """What a finished run left: exit code, timing, logs, metrics and the rank-0 summary."""

    returncode: int
    wall_s: float
    run_dir: Path
    logs: dict[int, list[str]]
    metrics: pd.DataFrame
    summary: dict[str, Any]
    command: list[str]
    launcher_output: list[str] = field(default_factory=list)
    attempts: int = 1
    resources: pd.DataFrame = field(default_factory=_empty_frame)  # per-rank CPU/RSS, per-GPU use, over time

    def log(self, rank: int) -> str:
        """Every line rank `rank` printed, stdout and stderr, in the order they were read."""
        return "\n".join(self.logs.get(rank, []))

    def __repr__(self) -> str:
        return (
            f"LaunchResult(returncode={self.returncode}, wall_s={self.wall_s:.2f}, ranks={sorted(self.logs)}, "
            f"metrics_rows={len(self.metrics)}, run_dir='{self.run_dir}')"
        )


class LaunchInterrupted(KeyboardInterrupt):
    """The cell was interrupted; every process of the run has been stopped."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"KeyboardInterrupt: {self}"]


def _pump(stream: IO[bytes], lines: queue.Queue[str | None]) -> None:
    for raw in iter(stream.readline, b""):
        lines.put(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
    lines.put(None)


@dataclass
class _RankState:
    last_heard: float | None = None
    last_line: str = ""
    last_step: int | None = None


class _Run:
    """One launch in progress: follows the agent's output, the rank logs and the metrics."""

    def __init__(self, config: LaunchConfig, progress: str) -> None:
        self.config = config
        self.tail = RankLogTail(config.log_dir, rank_offset=config.rank_offset)
        self.follower = MetricsFollower(config.run_dir)
        self.progress = StepProgress(progress, config.script.name)
        # on one node the ranks are known up front; across nodes the rendezvous decides
        expected = range(config.nproc) if config.nnodes == 1 else ()
        self.ranks = {r: _RankState() for r in expected}
        self.logs: dict[int, list[str]] = {r: [] for r in self.ranks}
        self.agent_lines: list[str] = []
        self.agent_quiet = False  # stop echoing torchrun once it starts its own failure report
        self.attempts_seen = 0
        self.last_progress = time.monotonic()

    # ---------------------------------------------------------------- following
    def on_agent_line(self, text: str) -> None:
        self.agent_lines.append(text)
        self.last_progress = time.monotonic()
        if "Traceback (most recent call last)" in text or "ChildFailedError" in text:
            self.agent_quiet = True
        if not self.agent_quiet:
            self.progress.write(f"[torchrun] {text}", stderr=True)

    def on_rank_line(self, line: LogLine) -> None:
        now = time.monotonic()
        state = self.ranks.setdefault(line.rank, _RankState())
        state.last_heard, state.last_line = now, line.text
        self.logs.setdefault(line.rank, []).append(line.text)
        self.last_progress = now
        show = self.config.show_ranks
        if show is None or line.rank in show:
            restart = f" (restart {line.attempt})" if line.attempt else ""
            self.progress.write(f"[rank {line.rank}{restart}] {line.text}", stderr=line.stream == "stderr")

    def on_metrics(self, records: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        for record in records:
            rank = record.get("rank")
            if isinstance(rank, int):
                state = self.ranks.setdefault(rank, _RankState())
                state.last_heard = now
                state.last_step = record.get("step", state.last_step)
        self.last_progress = now
        lead = [r for r in records if r.get("rank") == self.config.rank_offset and "step" in r]
        if lead:
            latest = lead[-1]
            postfix = {"loss": f"{latest['loss']:.4f}"} if isinstance(latest.get("loss"), int | float) else {}
            self.progress.update(int(latest["step"]), self.follower.total_steps(), **postfix)

    def poll_files(self, final: bool = False) -> None:
        for line in self.tail.read_new(final=final):
            self.on_rank_line(line)
        records = self.follower.read_new()
        if records:
            self.on_metrics(records)
        attempts = self.tail.attempts()
        if attempts > max(self.attempts_seen, 1):
            self.progress.write(
                f"[torchrun] restart {attempts - 1} of {self.config.max_restarts}: workers restarted"
            )
        self.attempts_seen = max(self.attempts_seen, attempts)

    # ---------------------------------------------------------------- reports
    def hang_report(self, alive_ranks: set[int]) -> LaunchTimeout:
        now = time.monotonic()
        rows, silent = [], []
        for rank, state in sorted(self.ranks.items()):
            heard = (
                "never heard from"
                if state.last_heard is None
                else f"last heard {now - state.last_heard:.1f}s ago"
            )
            status = "running" if rank in alive_ranks else "exited"
            step = f", last step {state.last_step}" if state.last_step is not None else ""
            line = f", last line: {state.last_line[:120]!r}" if state.last_line else ""
            rows.append(f"  rank {rank}: {status}, {heard}{step}{line}")
            if state.last_heard is None or now - state.last_heard >= (self.config.timeout or 0):
                silent.append(rank)
        advice = []
        if all(state.last_heard is None for state in self.ranks.values()):
            advice.append(
                "No rank printed anything: if start-up (importing torch, the rendezvous) is slow here, "
                "a longer timeout may be all that is needed."
            )
        advice += [
            "To find the collective that does not match, rerun with env={'TORCH_DISTRIBUTED_DEBUG': 'DETAIL'}"
            + (" and 'NCCL_DEBUG': 'INFO'." if self.config.backend == "nccl" else "."),
            "A rank that exited while others still run usually means uneven inputs or a skipped collective.",
        ]
        message = (
            f"the run hung: no output and no metrics for {self.config.timeout:g}s, so every process was stopped "
            f"(SIGTERM, then SIGKILL after {self.config.grace_s:g}s).\n"
            f"silent ranks: {', '.join(map(str, silent)) or 'none'}\n"
            + "\n".join(rows)
            + "\n"
            + "\n".join(advice)
        )
        return LaunchTimeout(message, silent_ranks=silent, run_dir=str(self.config.run_dir))

    def failure(self, returncode: int) -> LaunchError:
        agent_output = "\n".join(self.agent_lines)
        # without an agent there is no torchrun report: the one process's own exit code is the rank's
        known = {self.config.rank_offset: returncode} if self.config.launcher == "python" else None
        diagnosis = diagnose(
            agent_output, self.tail, self.config.nproc, cuda_available=visible_gpus() > 0, exitcodes=known
        )
        if diagnosis is None and "RendezvousTimeoutError" in agent_output:
            return LaunchFailed(
                f"the rendezvous timed out: not all {self.config.nnodes} nodes joined at "
                f"{self.config.rdzv_endpoint} within {self.config.rdzv_timeout or 600:g}s, so no worker started. "
                "Start every node with the same rdzv_endpoint and nnodes, each with its own node_rank, "
                "and check that the first node's port is reachable from the others.",
                returncode=returncode,
                output=agent_output,
            )
        if diagnosis is None:
            tail = "\n".join(self.agent_lines[-30:])
            return LaunchFailed(
                f"{self.config.launcher} exited with code {returncode} before any worker reported an error.\n{tail}",
                returncode=returncode,
                output=agent_output,
            )
        return WorkerFailed(
            diagnosis.rank,
            diagnosis.exitcode,
            diagnosis.error,
            diagnosis.traceback,
            hint=diagnosis.hint,
            run_dir=str(self.config.run_dir),
            logs=self.logs,
        )


def launch(
    script: str | os.PathLike[str],
    *script_args: str | int | float,
    nproc: int | None = None,
    backend: str = "auto",
    timeout: float | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    max_restarts: int = 0,
    show_ranks: object = "all",
    progress: str = "auto",
    grace_s: float = 5.0,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_timeout: float | None = None,
    launcher: str = "torchrun",
) -> LaunchResult:
    """Run `script` under ``python -m torch.distributed.run`` and stream every rank's output live.

    Args:
        script: the worker file; it must run under plain torchrun.
        script_args: its command-line arguments (strings or numbers).
        nproc: processes on this node; default one per visible GPU, or 2 on the CPU.
        backend: "auto" (nccl with GPUs, gloo without), "gloo" or "nccl". Workers read it
            from the ``DDP_BACKEND`` environment variable, and the device from ``DDP_DEVICE``.
        timeout: seconds without progress (no output line, no metrics line) before the run is
            declared hung and killed. None waits for ever.
        run_dir: where logs, metrics and the summary go; default ``runs/<time>-<script>-<id>``.
        env: extra environment variables for the workers.
        max_restarts: torchrun's elastic restarts after a failure.
        show_ranks: which ranks to echo into the cell: "all", "none", a rank, or a list.
            Every line is kept in the result either way.
        progress: "auto", "widget", "text" or "off".
        grace_s: seconds between SIGTERM and SIGKILL when stopping the run.
        nnodes, node_rank, rdzv_endpoint: for a multi-node job, this node's agent; every node
            uses the same endpoint ("host:port" of the first node) and its own node_rank.
        rdzv_timeout: seconds to wait for all nodes to join (torchrun's default is 600).
        launcher: "torchrun", or "python" for a one-process run without the agent: the script gets
            the environment torchrun would give a world of one (RANK, WORLD_SIZE, MASTER_PORT, the
            error file), and starts a few seconds sooner because only one interpreter imports torch.

    Returns:
        A `LaunchResult`.

    Raises:
        InvalidLaunchArguments: before anything starts, for bad input.
        WorkerFailed: a rank failed; the message names it and shows its root-cause traceback.
        LaunchTimeout: no progress within `timeout`.
        LaunchFailed: torchrun failed with no worker to blame (e.g. a rendezvous timeout).
        LaunchInterrupted: the cell was interrupted (a KeyboardInterrupt); all processes were stopped.
    """
    if progress not in PROGRESS_CHOICES:
        raise InvalidLaunchArguments(
            f"progress must be one of {', '.join(PROGRESS_CHOICES)}, got {progress!r}"
        )
    config = make_config(
        script, script_args, nproc=nproc, backend=backend, timeout=timeout, run_dir=run_dir, env=env,
        max_restarts=max_restarts, show_ranks=show_ranks, grace_s=grace_s, nnodes=nnodes,
        node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_timeout=rdzv_timeout, launcher=launcher,
    )  # fmt: skip
    return _execute(config, resolve_progress(progress))


def _execute(config: LaunchConfig, progress: str) -> LaunchResult:
    config.log_dir.mkdir(parents=True, exist_ok=True)
    command = config.command()
    run = _Run(config, progress)
    started = time.monotonic()
    direct = config.launcher == "python"
    if direct:
        # no agent: the process writes straight into the files torchrun's --redirects would write
        config.direct_log_dir.mkdir(parents=True, exist_ok=True)
        stdout = open(config.direct_log_dir / "stdout.log", "wb")  # closed once the child has it
        stderr: Any = open(config.direct_log_dir / "stderr.log", "wb")
    else:
        stdout, stderr = subprocess.PIPE, subprocess.STDOUT
    try:
        proc = subprocess.Popen(
            command,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=config.environment(),
            start_new_session=True,  # the whole run can be signalled without touching the kernel
        )
    finally:
        if direct:
            stdout.close()  # the child holds its own copies
            stderr.close()
    tree = ProcessTree(proc.pid)
    sampler = ResourceSampler(tree, gpus=config.device == "cuda", root_is_worker=direct)
    agent_lines: queue.Queue[str | None] = queue.Queue()
    if proc.stdout is not None:
        pump = threading.Thread(target=_pump, args=(proc.stdout, agent_lines), daemon=True)
        pump.start()
    else:
        pump = None
    success = False
    try:
        last_refresh = 0.0
        while True:
            _drain(agent_lines, run)
            run.poll_files()
            if proc.poll() is not None:
                break
            now = time.monotonic()
            if now - last_refresh > 0.5:
                tree.refresh()
                sampler.sample()
                run.tail.learn_ranks(sampler.local_to_global)
                last_refresh = now
            if config.timeout is not None and now - run.last_progress > config.timeout:
                tree.refresh()
                sampler.sample()  # also learns the ranks of workers started since the last sample
                error = run.hang_report(sampler.alive_ranks())
                tree.terminate(config.grace_s)
                raise error
            time.sleep(POLL_S)
        if pump is not None:
            pump.join(timeout=5)
        _drain(agent_lines, run)
        run.poll_files(final=True)
        if proc.returncode != 0:
            raise run.failure(proc.returncode)
        success = True
    except KeyboardInterrupt:
        killed = tree.terminate(config.grace_s)
        detail = f" ({len(killed)} needed SIGKILL)" if killed else ""
        raise LaunchInterrupted(
            f"interrupted: every process of the run was stopped{detail}; logs are in {config.run_dir}"
        ) from None
    finally:
        tree.terminate(config.grace_s)  # anything a worker left behind goes too
        run.progress.close(success)
        if proc.stdout:
            proc.stdout.close()
    return LaunchResult(
        returncode=proc.returncode,
        wall_s=time.monotonic() - started,
        run_dir=config.run_dir,
        logs=run.logs,
        metrics=read_metrics(config.run_dir),
        summary=read_summary(config.run_dir),
        command=command,
        launcher_output=run.agent_lines,
        attempts=max(run.attempts_seen, 1),
        resources=sampler.frame(),
    )


def _drain(lines: queue.Queue[str | None], run: _Run) -> None:
    while True:
        try:
            text = lines.get_nowait()
        except queue.Empty:
            return
        if text is not None:
            run.on_agent_line(text)
