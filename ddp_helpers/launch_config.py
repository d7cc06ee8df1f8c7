"""Checking `launch()`'s arguments and turning them into a torchrun command line.

Everything here runs before a process is spawned, so bad input never leaves anything behind.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InvalidLaunchArguments

BACKENDS = ("auto", "gloo", "nccl")
LAUNCHERS = ("torchrun", "python")
RUNS_DIR_ENV = "DDP_HELPERS_RUNS_DIR"


def visible_gpus() -> int:
    """CUDA devices this process can see (0 without a CUDA build or a driver)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver must not stop a CPU run
        return 0


@dataclass
class LaunchConfig:
    """A validated launch: what to run, where, and how to watch it."""

    script: Path
    script_args: list[str]
    nproc: int
    backend: str  # resolved: "gloo" or "nccl"
    device: str  # "cpu" or "cuda"
    run_dir: Path
    timeout: float | None
    max_restarts: int
    show_ranks: set[int] | None  # None: every rank
    grace_s: float
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_timeout: float | None = None  # seconds to wait for every node to join
    extra_env: dict[str, str] = field(default_factory=dict)
    launcher: str = "torchrun"  # "python": one process, no agent (see `launch`)
    python: str = sys.executable

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def rank_offset(self) -> int:
        return self.node_rank * self.nproc

    @property
    def direct_log_dir(self) -> Path:
        """Where a ``launcher="python"`` run keeps its logs: torchrun's layout, so one reader serves both."""
        return self.log_dir / "python" / "attempt_0" / "0"

    def command(self) -> list[str]:
        if self.launcher == "python":
            return [self.python, str(self.script), *self.script_args]
        cmd = [self.python, "-m", "torch.distributed.run", "--nproc-per-node", str(self.nproc)]
        if self.nnodes == 1:
            cmd += ["--standalone"]  # c10d rendezvous on a free localhost port: no clashes
        else:
            cmd += [
                "--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", str(self.rdzv_endpoint),
            ]  # fmt: skip
            if self.rdzv_timeout is not None:
                cmd += ["--rdzv-conf", f"join_timeout={self.rdzv_timeout:g}"]
        # Each rank writes its own stdout/stderr files, which we follow: lines never merge.
        cmd += ["--max-restarts", str(self.max_restarts), "--log-dir", str(self.log_dir), "--redirects", "3"]
        return [*cmd, str(self.script), *self.script_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # torchrun would set 1 thread per worker and warn; share the cores out instead.
        threads = max(1, (os.cpu_count() or 1) // (self.nproc if self.device == "cpu" else 1))
        env.setdefault("OMP_NUM_THREADS", str(threads))
        env.update(
            PYTHONUNBUFFERED="1",  # a worker's print reaches its log file, and the cell, at once
            PYTHONFAULTHANDLER="1",  # a segfault still leaves a Python stack in stderr
            DDP_BACKEND=self.backend,
            DDP_DEVICE=self.device,
            DDP_RUN_DIR=str(self.run_dir),  # where workers write metrics/ and summary.json
        )
        if self.launcher == "python":
            # what torchrun would give a world of one, so the same script runs unchanged
            env.update(
                RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                TORCHELASTIC_ERROR_FILE=str(self.direct_log_dir / "error.json"),  # for @record
            )  # fmt: skip
        if self.max_restarts > 0:
            # torchrun keeps one shared TCPStore across restart rounds, so restarted workers can read
            # the dead workers' addresses and fail with "connectFullMesh ... Connection refused"
            # (seen on torch 2.14; cf. pytorch/pytorch#167288). A fresh store per round avoids it.
            env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        env.update(self.extra_env)
        return env


def free_port() -> int:
    """A TCP port that was free on localhost a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidLaunchArguments(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidLaunchArguments(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_script_args(args: Iterable[object]) -> list[str]:
    checked = []
    for arg in args:
        if isinstance(arg, bool) or not isinstance(arg, str | int | float | os.PathLike):
            raise InvalidLaunchArguments(
                f"script argument {arg!r} is a {type(arg).__name__}; pass strings, numbers or paths "
                "(for a flag, pass its name, e.g. '--deterministic')"
            )
        checked.append(os.fspath(arg) if isinstance(arg, os.PathLike) else str(arg))
    return checked


def _check_show_ranks(show_ranks: object) -> set[int] | None:
    if show_ranks == "all":
        return None
    if show_ranks is None or show_ranks == "none":
        return set()
    if isinstance(show_ranks, int) and not isinstance(show_ranks, bool):
        return {show_ranks}
    if isinstance(show_ranks, Iterable) and not isinstance(show_ranks, str):
        ranks = list(show_ranks)
        if all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            return set(ranks)
    raise InvalidLaunchArguments(
        f"show_ranks must be 'all', 'none', a rank or a list of ranks, got {show_ranks!r}"
    )


def _resolve_backend(backend: str, nproc: int | None, gpus: int) -> tuple[str, str, int]:
    if backend not in BACKENDS:
        raise InvalidLaunchArguments(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "nccl" if gpus > 0 else "gloo"
    if nproc is None:
        nproc = gpus if gpus > 0 else 2
    nproc = _check_int("nproc", nproc, 1)
    if backend == "nccl":
        if gpus == 0:
            raise InvalidLaunchArguments(
                "backend 'nccl' needs CUDA GPUs and none are visible; use 'gloo' on the CPU"
            )
        if nproc > gpus:
            raise InvalidLaunchArguments(
                f"nproc={nproc} but only {gpus} GPU(s) are visible: NCCL needs one GPU per process. "
                f"Use nproc<={gpus}, or backend='gloo' to run on the CPU"
            )
    return backend, ("cuda" if backend == "nccl" else "cpu"), nproc


def default_run_dir(stem: str) -> Path:
    """A new, unique ``runs/<time>-<stem>-<id>`` (under $DDP_HELPERS_RUNS_DIR if set)."""
    base = Path(os.environ.get(RUNS_DIR_ENV, "runs"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (base / f"{stamp}-{stem}-{secrets.token_hex(3)}").resolve()


def make_config(
    script: str | os.PathLike[str],
    script_args: Iterable[object],
    *,
    nproc: int | None,
    backend: str,
    timeout: float | None,
    run_dir: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    max_restarts: int,
    show_ranks: object,
    grace_s: float,
    nnodes: int,
    node_rank: int,
    rdzv_endpoint: str | None,
    rdzv_timeout: float | None = None,
    launcher: str = "torchrun",
) -> LaunchConfig:
    """Validate `launch()`'s arguments. Raises `InvalidLaunchArguments` saying what to change."""
    script_path = Path(script).expanduser()
    if not script_path.is_file():
        raise InvalidLaunchArguments(f"script not found: {script_path} (cwd is {Path.cwd()})")
    gpus = visible_gpus()
    if launcher == "python" and nproc is None:
        nproc = 1
    backend, device, nproc = _resolve_backend(backend, nproc, gpus)
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise InvalidLaunchArguments(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if not isinstance(grace_s, int | float) or grace_s < 0:
        raise InvalidLaunchArguments(f"grace_s must be >= 0, got {grace_s!r}")
    extra_env = dict(env or {})
    bad = [k for k, v in extra_env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise InvalidLaunchArguments(f"env keys and values must be strings; check {bad}")
    nnodes = _check_int("nnodes", nnodes, 1)
    node_rank = _check_int("node_rank", node_rank, 0)
    if node_rank >= nnodes:
        raise InvalidLaunchArguments(f"node_rank must be < nnodes ({nnodes}), got {node_rank}")
    if nnodes > 1 and not (isinstance(rdzv_endpoint, str) and re.fullmatch(r"[^\s:]+:\d+", rdzv_endpoint)):
        raise InvalidLaunchArguments(
            f"nnodes={nnodes} needs rdzv_endpoint='host:port', got {rdzv_endpoint!r}"
        )
    if rdzv_timeout is not None and (not isinstance(rdzv_timeout, int | float) or rdzv_timeout <= 0):
        raise InvalidLaunchArguments(
            f"rdzv_timeout must be a positive number of seconds, got {rdzv_timeout!r}"
        )
    if launcher not in LAUNCHERS:
        raise InvalidLaunchArguments(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if launcher == "python" and (nproc != 1 or nnodes != 1 or max_restarts):
        raise InvalidLaunchArguments(
            "launcher='python' runs one process without torchrun's agent: it needs nproc=1, nnodes=1 and "
            f"max_restarts=0 (got nproc={nproc}, nnodes={nnodes}, max_restarts={max_restarts})"
        )
    return LaunchConfig(
        script=script_path.resolve(),
        script_args=_check_script_args(script_args),
        nproc=nproc,
        backend=backend,
        device=device,
        run_dir=Path(run_dir).expanduser().resolve()
        if run_dir is not None
        else default_run_dir(script_path.stem),
        timeout=float(timeout) if timeout is not None else None,
        max_restarts=_check_int("max_restarts", max_restarts, 0),
        show_ranks=_check_show_ranks(show_ranks),
        grace_s=float(grace_s),
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_timeout=rdzv_timeout,
        extra_env=extra_env,
        launcher=launcher,
    )
