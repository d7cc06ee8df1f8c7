"""`launch()`: run a script under torchrun as a subprocess, watch it live, and never leave a process behind."""

from __future__ import annotations

import inspect
import os
import time
from typing import Any, Unpack

from .. import stack_dumps
from ..errors import LaunchError, LaunchFailed, LaunchInterrupted
from .agent_client import (
    reap_stopped_servers_in_background,
    stop_servers,
)
from .config import LaunchConfig, make_config
from .keywords import LaunchKeywords
from .options import OPTIONS, with_options
from .process_tree import ProcessTree
from .processes import exit_code, start_run, stop_despite_interrupts, stop_interrupted, stop_run
from .progress import resolve_progress
from .resources import ResourceSampler
from .result import LaunchResult
from .run_follower import RunFollower
from .run_lock import holding_run_dir
from .run_outputs import keep_previous_outputs, read_metrics, read_summary
from .run_process import RunProcess

__all__ = ["LaunchResult", "launch"]

POLL_S = 0.1
REFRESH_S = 0.5  # how often the process tree and the resources are sampled


def _start(config: LaunchConfig, run: RunFollower, env: dict[str, str]) -> Any:
    """`start_run`, which waits for a cold agent server to import torch: an interrupt there stops it."""
    try:
        return start_run(config, env)
    except KeyboardInterrupt:
        try:
            stop_servers()
        except KeyboardInterrupt:  # interrupted again: the servers are told to leave all the same
            stop_servers()
        reap_stopped_servers_in_background()
        run.echo.close()
        run.progress.close(False)
        raise LaunchInterrupted(
            f"interrupted while the run started: nothing of it is left running; logs are in {config.out_dir}"
        ) from None


def _failure(run: RunFollower, proc: RunProcess, returncode: int) -> LaunchError:
    if proc.status_lost:  # see agent_client.ForkedAgent
        return LaunchFailed(
            "torchrun's agent was killed by a signal after the agent server that started it had died, so "
            f"how the run ended is unknown. Logs are in {run.config.out_dir}",
            returncode=returncode,
            output="\n".join(run.agent_lines),
        )
    return run.failure(returncode)


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
    **options: Unpack[LaunchKeywords],
) -> LaunchResult:
    """Run `script` under torchrun (``torch.distributed.run``) and stream every rank's output live.

    Options (keywords; each is a field of `options.LaunchOptions`, where it is declared once):
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
    config = make_config(script, script_args, **options)
    return run_config(config)


def run_config(config: LaunchConfig, progress: str | None = None) -> LaunchResult:
    """Run a validated `LaunchConfig` (what `launch` does after checking its arguments).

    Raises `RunDirInUse` (an `InvalidLaunchArguments`) while another launch runs into the same run_dir.
    """
    with holding_run_dir(config.out_dir):
        return _run_held(config, progress)


def _run_held(config: LaunchConfig, progress: str | None) -> LaunchResult:
    keep_previous_outputs(config.out_dir)
    run = RunFollower(config, progress or resolve_progress(config.progress))
    env = config.environment()
    proc = _start(config, run, env)
    tree = ProcessTree(proc.pid)
    sampler = ResourceSampler(tree, gpus=config.device == "cuda", root_is_worker=config.launcher == "python")
    success = False
    try:
        last_refresh = 0.0
        while True:
            run.poll_files()
            returncode = exit_code(proc)
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
            run.note_waiting_for_nodes()
            if run.hung(now):
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
        success = True
    except KeyboardInterrupt as interrupt:
        if isinstance(interrupt, LaunchInterrupted):
            raise
        raise stop_interrupted(tree, proc, config) from None
    finally:
        stop_despite_interrupts(tree, proc, config.grace_s)  # anything a worker left behind goes too
        run.echo.close()
        run.progress.close(success)
    return _result(config, run, proc, sampler, env)


def _result(
    config: LaunchConfig, run: RunFollower, proc: RunProcess, sampler: ResourceSampler, env: dict[str, str]
) -> LaunchResult:
    return LaunchResult(
        returncode=0,  # any other code raised
        wall_s=time.monotonic() - run.started,
        run_dir=config.out_dir,
        logs=run.logs,
        metrics=read_metrics(config.out_dir),
        summary=read_summary(config.out_dir),
        command=config.command(),
        environment={name: value for name, value in env.items() if os.environ.get(name) != value},
        launcher_output=run.agent_lines,
        attempts=max(run.attempts_seen, 1),
        resources=sampler.frame(),
        gpu_sampling=sampler.gpu_sampling,
        lines_held_back=run.echo.held_back,
        agent=proc.kind,
        agent_wait_s=proc.wait_s,
    )
