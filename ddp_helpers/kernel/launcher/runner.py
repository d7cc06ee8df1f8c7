"""`launch()`: run a script under torchrun, watch it live, and never leave a process behind; and its run
folder: one launch at a time, an earlier launch's outputs moved aside, what the ranks wrote read after."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import inspect
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddp_helpers.errors import LaunchError, LaunchFailed, LaunchInterrupted, RunDirInUse
from ddp_helpers.kernel.launcher.agent_client import reap_stopped_servers_in_background, stop_servers
from ddp_helpers.kernel.launcher.config import LaunchConfig, make_config
from ddp_helpers.kernel.launcher.options import OPTIONS, with_options
from ddp_helpers.kernel.launcher.processes import (
    ProcessTree,
    RunProcess,
    start_run,
    stop_despite_interrupts,
    stop_interrupted,
    stop_run,
)
from ddp_helpers.kernel.launcher.resources import ResourceSampler
from ddp_helpers.kernel.launcher.run_follower import RunFollower
from ddp_helpers.rank import stack_dumps
from ddp_helpers.rank.metrics import METRICS_DIR, SUMMARY_FILE
from ddp_helpers.run_contract import RUN_OUTPUTS

__all__ = ["LaunchResult", "holding_run_dir", "launch", "read_metrics", "read_summary"]

if TYPE_CHECKING:
    import pandas as pd

POLL_S = 0.1
REFRESH_S = 0.5  # how often the process tree and the resources are sampled
WAITING_NOTE_EVERY_S = 5.0


def _start(config: LaunchConfig, env: dict[str, str]) -> RunProcess:
    """`start_run`, which may wait for a cold agent server to import torch: an interrupt there stops it."""
    try:
        return start_run(config, env)
    except KeyboardInterrupt:
        try:
            stop_servers()
        except KeyboardInterrupt:  # interrupted again: the servers are told to leave all the same
            stop_servers()
        reap_stopped_servers_in_background()
        raise LaunchInterrupted(
            f"interrupted while the run started: nothing of it is left running; logs are in {config.out_dir}"
        ) from None


def _note_waiting_for_nodes(run: RunFollower) -> None:
    """Across nodes, until this node's workers start: say how long the rendezvous has waited."""
    now = time.monotonic()
    config = run.config
    if config.nnodes == 1 or run.tail.started() or now - run.last_waiting_note < WAITING_NOTE_EVERY_S:
        return
    run.last_waiting_note = now
    run.echo.write(
        f"[ddp_helpers] node {config.node_rank}: waiting for all {config.nnodes} nodes to join at "
        f"{config.rdzv_endpoint}: {now - run.started:.0f}s of {config.rdzv_timeout:g}s (rdzv_timeout)",
        False,
    )


@contextlib.contextmanager
def _stopped_at_exit(tree: ProcessTree, proc: RunProcess, grace_s: float) -> Iterator[None]:
    """However the block ends, every process of the run is stopped."""
    try:
        yield
    finally:
        stop_despite_interrupts(tree, proc, grace_s)


def _hung(run: RunFollower, now: float) -> bool:
    """No progress within the timeout (before any rank was heard from: the start-up allowance)."""
    config = run.config
    if config.timeout is None:
        return False
    limit = config.timeout
    if not run.heard_any and config.startup_timeout is not None:
        limit = max(limit, config.startup_timeout)
    if not run.heard_any and config.nnodes > 1:
        limit = max(limit, config.rdzv_timeout or 0)  # waiting for nodes is not a hang
    return now - run.last_progress > limit


def _failure(run: RunFollower, proc: RunProcess, returncode: int) -> LaunchError:
    if proc.status_lost:  # see agent_client.ForkedAgent
        return LaunchFailed(
            "torchrun's agent was killed by a signal after the agent server that started it had died, so "
            f"how the run ended is unknown. Logs are in {run.config.out_dir}",
            returncode=returncode,
            output="\n".join(run.agent_lines),
        )
    return run.failure(returncode)


def _frame(rows: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    import pandas as pd  # only here: a launch pays for pandas when its result is built

    return pd.DataFrame(rows) if rows else pd.DataFrame()


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
    environment: dict[str, str] = field(default_factory=dict)  # what the run got on top of this process's
    launcher_output: list[str] = field(default_factory=list)
    attempts: int = 1
    resources: pd.DataFrame = field(default_factory=_frame)  # per-rank CPU/RSS, per-GPU use, over time
    gpu_sampling: str = "not requested"  # "sampled", or why not ("not sampled: ...")
    lines_held_back: int = 0  # lines not echoed into the cell (all are in `logs` and on disk)
    agent: str = "none"  # how torchrun's agent started: "forked" (agent server), "fresh", or "none" (python)
    agent_wait_s: float = 0.0  # launch()'s wait for the fork (a cold server: the rest of its import)

    def log(self, rank: int) -> str:
        return "\n".join(self.logs.get(rank, []))

    def __repr__(self) -> str:
        return (
            f"LaunchResult(returncode={self.returncode}, wall_s={self.wall_s:.2f}, ranks={sorted(self.logs)}, "
            f"metrics_rows={len(self.metrics)}, run_dir='{self.run_dir}')"
        )


@with_options(
    OPTIONS,
    [
        inspect.Parameter("script", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("script_args", inspect.Parameter.VAR_POSITIONAL),
    ],
)
def launch(
    script: str | os.PathLike[str],
    *script_args: str | int | float | os.PathLike[str],
    **options: Any,
) -> LaunchResult:
    """Run `script` under torchrun (``torch.distributed.run``) and stream every rank's output live.

    Options (keywords; each a field of `options.LaunchOptions`, declared once there):
        {options}

    Returns:
        A `LaunchResult`.

    Raises:
        InvalidLaunchArguments: before anything starts, for bad input.
        WorkerFailed: a rank failed; the message names it and shows its root-cause traceback.
        LaunchTimeout: no progress within `timeout`.
        LaunchFailed: torchrun failed with no worker to blame (e.g. a rendezvous timeout).
        LaunchInterrupted: the cell was interrupted (a KeyboardInterrupt); all processes were stopped.
    """
    return run_config(make_config(script, script_args, **options))


def run_config(config: LaunchConfig) -> LaunchResult:
    """Run a checked `LaunchConfig`; `RunDirInUse` while another launch runs into the same run_dir."""
    with holding_run_dir(config.out_dir):
        keep_previous_outputs(config.out_dir)
        with RunFollower(config) as run:  # which closes the cell's output at the end
            env, command = config.environment(), config.command()
            proc = _start(config, env)
            tree = ProcessTree(proc.pid)
            sampler = ResourceSampler(
                tree, gpus=config.device == "cuda", root_is_worker=config.launcher == "python"
            )
            with _stopped_at_exit(tree, proc, config.grace_s):
                try:
                    _follow(config, run, proc, tree, sampler)
                except KeyboardInterrupt as interrupt:
                    if isinstance(interrupt, LaunchInterrupted):
                        raise
                    raise stop_interrupted(tree, proc, config) from None
        return LaunchResult(
            returncode=0,  # any other code raised
            wall_s=time.monotonic() - run.started,
            run_dir=config.out_dir,
            logs=run.logs,
            metrics=read_metrics(config.out_dir),
            summary=read_summary(config.out_dir),
            command=command,
            environment={name: value for name, value in env.items() if os.environ.get(name) != value},
            launcher_output=run.agent_lines,
            attempts=max(run.attempts_seen, 1),
            resources=_frame(sampler.rows),
            gpu_sampling=sampler.gpu_sampling,
            lines_held_back=run.echo.held_back,
            agent=proc.kind,
            agent_wait_s=proc.wait_s,
        )


def _follow(
    config: LaunchConfig, run: RunFollower, proc: RunProcess, tree: ProcessTree, sampler: ResourceSampler
) -> None:
    """Echo the run until it ends; raise if it failed or hung (stopping a hung run first)."""
    last_refresh = 0.0
    while True:
        run.poll_files()
        returncode = proc.poll()
        if returncode is not None:
            break
        now = time.monotonic()
        # across nodes, a rank's lines wait until its worker says who it is: look sooner
        unmapped = config.nnodes > 1 and len(sampler.local_to_global) < config.local_world_size
        if now - last_refresh > (POLL_S if unmapped else REFRESH_S):
            tree.refresh()
            sampler.sample()
            run.tail.learn_ranks(sampler.local_to_global)
            last_refresh = now
        _note_waiting_for_nodes(run)
        if _hung(run, now):
            tree.refresh()
            sampler.sample()  # also learns the ranks of workers started since the last sample
            pids = sampler.alive_pids()  # each live rank's, to ask where it waits
            error = run.hang_report(set(pids), stack_dumps.ask(pids, config.log_dir))
            stop_run(tree, proc, config.grace_s)
            raise error
        time.sleep(POLL_S)
    run.poll_files(final=True)
    if returncode != 0:
        raise _failure(run, proc, returncode)


def read_metrics(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """All ranks' logged steps as one DataFrame, sorted by rank and step."""
    import pandas as pd  # here: a launch without a metrics table never pays for pandas

    rows: list[dict[str, Any]] = []
    for path in sorted((Path(run_dir) / METRICS_DIR).glob("rank*.jsonl")):
        with open(path) as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    frame = pd.DataFrame(rows)
    if not frame.empty and {"rank", "step"} <= set(frame.columns):
        frame = frame.sort_values(["rank", "step"], kind="stable")
        # after an elastic restart the steps since the last checkpoint are logged twice: keep the rerun
        frame = frame.drop_duplicates(subset=["rank", "step"], keep="last").reset_index(drop=True)
    return frame


def read_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The summary rank 0 wrote at the end, or {} if the run never got there."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def keep_previous_outputs(run_dir: Path) -> None:
    """Move an earlier launch's logs, metrics and summary to ``run_dir/previous/<n>``; other files stay."""
    found = [run_dir / name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not found:
        return
    previous = run_dir / "previous"
    index = 1 + max((int(p.name) for p in previous.glob("*") if p.name.isdigit()), default=0)
    target = previous / str(index)
    target.mkdir(parents=True)
    for path in found:
        shutil.move(str(path), str(target / path.name))


# an exclusive flock, which the OS drops however the holder ends: a killed kernel leaves no stale lock
LOCK_NAME = ".launch.lock"


@contextlib.contextmanager
def holding_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir` for one launch; raise `RunDirInUse` at once if another launch holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # no child inherits the lock
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise RunDirInUse(
                f"run_dir {run_dir} is in use by another launch ({holder}): two runs in one folder would "
                "mix their logs. Wait for it to end, or give this launch another run_dir"
            ) from None
        os.ftruncate(fd, 0)
        try:
            os.pwrite(fd, f"process {os.getpid()}, started {time.strftime('%H:%M:%S')}\n".encode(), 0)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            raise LaunchError(
                f"nothing was started: no space left on the device that holds run_dir {run_dir}. Free some "
                "space, or give the launch a run_dir on another device"
            ) from error
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
