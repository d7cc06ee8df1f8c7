"""`LaunchConfig`: the one statement of `launch()`'s options, their defaults and their checks.

`launch()`, ``%%torchrun``, ``python -m ddp_helpers launch`` and live ranks all build a `LaunchConfig`
from what the user gave and leave the rest to its defaults. It validates itself on construction, so
bad input is refused before a process is spawned, and turns into a torchrun command line.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import secrets
import sys
import time
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..backends import BACKENDS, resolve_backend  # the one rule, shared with every worker
from ..errors import InvalidLaunchArguments
from .machine import free_port, threads_per_rank, visible_gpus

LAUNCHERS = ("torchrun", "python")
PROGRESS_CHOICES = ("auto", "widget", "text", "off")
RUNS_DIR_ENV = "DDP_HELPERS_RUNS_DIR"
MULTINODE_RDZV_TIMEOUT_S = 120.0  # torchrun waits 600 s for a missing node: too long for a cell
# What one launch writes into its run_dir; a later launch into the same folder moves them aside.
RUN_OUTPUTS = ("logs", "metrics", "summary.json", "plan.json")


def default_run_dir(stem: str) -> Path:
    """A new, unique ``runs/<time>-<stem>-<id>`` (under $DDP_HELPERS_RUNS_DIR if set)."""
    base = Path(os.environ.get(RUNS_DIR_ENV, "runs"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (base / f"{stamp}-{stem}-{secrets.token_hex(3)}").resolve()


# ---------------------------------------------------------------------------- checks


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidLaunchArguments(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidLaunchArguments(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_seconds(name: str, value: object, *, allow_none: bool, allow_zero: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        what = ">= 0" if allow_zero else "a positive number of"
        raise InvalidLaunchArguments(
            f"{name} must be {what} seconds{' or None' if allow_none else ''}, got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


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


def _check_show_ranks(show_ranks: object, world_size: int) -> set[int] | None:
    if show_ranks == "all":
        return None
    if show_ranks is None or show_ranks == "none":
        return set()
    ranks: list[object] | None = None
    if isinstance(show_ranks, int) and not isinstance(show_ranks, bool):
        ranks = [show_ranks]
    elif isinstance(show_ranks, Iterable) and not isinstance(show_ranks, str):
        ranks = list(show_ranks)
    if ranks is None or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise InvalidLaunchArguments(
            f"show_ranks must be 'all', 'none', a rank or a list of ranks, got {show_ranks!r}"
        )
    outside = sorted(r for r in ranks if not 0 <= r < world_size)  # type: ignore[operator]
    if outside:
        raise InvalidLaunchArguments(
            f"show_ranks {outside} is outside this world of {world_size} rank(s) (0..{world_size - 1})"
        )
    return set(ranks)  # type: ignore[arg-type]


def _check_run_dir(run_dir: Path) -> Path:
    # an ancestor that is a file would surface later as a raw NotADirectoryError
    for folder in (run_dir, *run_dir.parents):
        if folder.exists():
            if not folder.is_dir():
                raise InvalidLaunchArguments(f"run_dir {run_dir} cannot be created: {folder} is a file")
            break
    return run_dir


def _resolve_backend(backend: object, nproc: object, gpus: int) -> tuple[str, str, int]:
    try:
        backend, device = resolve_backend(backend, gpus)  # type: ignore[arg-type]
    except ValueError as err:
        raise InvalidLaunchArguments(str(err)) from None
    nproc = _check_int("nproc", gpus if gpus > 0 and nproc is None else (2 if nproc is None else nproc), 1)
    if backend == "nccl" and nproc > gpus:
        raise InvalidLaunchArguments(
            f"nproc={nproc} but only {gpus} GPU(s) are visible: NCCL needs one GPU per process. "
            f"Use nproc<={gpus}, or backend='gloo' to run on the CPU"
        )
    return backend, device, nproc


# ---------------------------------------------------------------------------- the config


@dataclass
class LaunchConfig:
    """A validated launch: what to run, where, and how to watch it. See `launch` for each option.

    Built with the user's options only; every default lives here. On construction, "auto" and None
    are resolved (`backend`, `nproc`, `run_dir`, `rdzv_timeout`), and bad input raises
    `InvalidLaunchArguments` before anything is spawned.
    """

    script: Path
    script_args: list[str] = field(default_factory=list)
    nproc: int | None = None  # None: one per visible GPU, or 2 on the CPU (1 with launcher="python")
    backend: str = "auto"  # resolved to "gloo" or "nccl"
    timeout: float | None = None  # seconds without progress before the run is called hung
    startup_timeout: float | None = None  # seconds allowed before the first sign of life; None: timeout
    run_dir: Path | None = None  # None: runs/<time>-<script>-<id>
    env: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    show_ranks: object = "all"
    progress: str = "auto"
    grace_s: float = 5.0
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_timeout: float | None = None  # None: MULTINODE_RDZV_TIMEOUT_S when nnodes > 1
    launcher: str = "torchrun"
    python: str = sys.executable
    gpus: int | None = None  # visible GPUs; None asks torch (tests pass a count instead)
    device: str = field(init=False)  # "cpu" or "cuda"
    shown_ranks: set[int] | None = field(init=False)  # None: every rank

    def __post_init__(self) -> None:
        # Every check that needs no torch comes first: a typo is refused in milliseconds, not after
        # the seconds that `import torch` takes to count the GPUs.
        self._check_arguments()
        self.gpus = visible_gpus() if self.gpus is None else self.gpus
        if self.launcher == "python" and self.nproc is None:
            self.nproc = 1
        self.backend, self.device, self.nproc = _resolve_backend(self.backend, self.nproc, self.gpus)
        if self.launcher == "python" and (self.nproc != 1 or self.nnodes != 1 or self.max_restarts):
            raise InvalidLaunchArguments(
                "launcher='python' runs one process without torchrun's agent: it needs nproc=1, nnodes=1 and "
                f"max_restarts=0 (got nproc={self.nproc}, nnodes={self.nnodes}, max_restarts={self.max_restarts})"
            )
        self.shown_ranks = _check_show_ranks(self.show_ranks, self.nproc * self.nnodes)
        run_dir = Path(self.run_dir).expanduser().resolve() if self.run_dir is not None else None
        self.run_dir = _check_run_dir(run_dir or default_run_dir(self.script.stem))

    def _check_arguments(self) -> None:
        """The checks that need neither torch nor the machine's GPUs."""
        script = Path(self.script).expanduser()
        if not script.is_file():
            raise InvalidLaunchArguments(f"script not found: {script} (cwd is {Path.cwd()})")
        self.script = script.resolve()
        self.script_args = _check_script_args(self.script_args)
        if self.launcher not in LAUNCHERS:
            raise InvalidLaunchArguments(
                f"launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}"
            )
        if self.progress not in PROGRESS_CHOICES:
            raise InvalidLaunchArguments(
                f"progress must be one of {', '.join(PROGRESS_CHOICES)}, got {self.progress!r}"
            )
        if self.backend not in BACKENDS:
            raise InvalidLaunchArguments(
                f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}"
            )
        if self.nproc is not None:
            self.nproc = _check_int("nproc", self.nproc, 1)
        if self.gpus is not None:
            self.gpus = _check_int("gpus", self.gpus, 0)
        self.timeout = _check_seconds("timeout", self.timeout, allow_none=True)
        self.startup_timeout = _check_seconds("startup_timeout", self.startup_timeout, allow_none=True)
        self.grace_s = _check_seconds("grace_s", self.grace_s, allow_none=False, allow_zero=True)  # type: ignore[assignment]
        self.max_restarts = _check_int("max_restarts", self.max_restarts, 0)
        self.env = dict(self.env or {})
        bad = [k for k, v in self.env.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise InvalidLaunchArguments(f"env keys and values must be strings; check {bad}")
        self.nnodes = _check_int("nnodes", self.nnodes, 1)
        self.node_rank = _check_int("node_rank", self.node_rank, 0)
        if self.node_rank >= self.nnodes:
            raise InvalidLaunchArguments(f"node_rank must be < nnodes ({self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and not (
            isinstance(self.rdzv_endpoint, str) and re.fullmatch(r"[^\s:]+:\d+", self.rdzv_endpoint)
        ):
            raise InvalidLaunchArguments(
                f"nnodes={self.nnodes} needs rdzv_endpoint='host:port', got {self.rdzv_endpoint!r}"
            )
        self.rdzv_timeout = _check_seconds("rdzv_timeout", self.rdzv_timeout, allow_none=True)
        if self.rdzv_timeout is None and self.nnodes > 1:
            self.rdzv_timeout = MULTINODE_RDZV_TIMEOUT_S
        if self.show_ranks not in ("all", "none", None) and self.nproc is not None:
            _check_show_ranks(self.show_ranks, self.nproc * self.nnodes)

    # ------------------------------------------------------------------ derived
    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"  # type: ignore[operator]

    @property
    def agent_log(self) -> Path:
        """torchrun's own output (its warnings, its failure report): kept, shown only when it explains."""
        return self.log_dir / "torchrun.log"

    @property
    def rank_offset(self) -> int:
        """node_rank * nproc: the global rank of local rank 0 where node_rank decides it (one node)."""
        return self.node_rank * self.nproc  # type: ignore[operator]

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes  # type: ignore[operator]

    @property
    def direct_log_dir(self) -> Path:
        """Where a ``launcher="python"`` run keeps its logs: torchrun's layout, so one reader serves both."""
        return self.log_dir / "python" / "attempt_0" / "0"

    def command(self) -> list[str]:
        if self.launcher == "python":
            return [self.python, str(self.script), *self.script_args]
        # torchrun's own main, run by our agent so that no orphan outlives the run (see torchrun_agent.py)
        cmd = [self.python, "-m", "ddp_helpers.launcher.torchrun_agent", "--nproc-per-node", str(self.nproc)]
        if self.nnodes == 1:
            cmd += ["--standalone"]  # c10d rendezvous on a free localhost port: no clashes
        else:
            cmd += [
                "--nnodes",
                str(self.nnodes),
                "--node-rank",
                str(self.node_rank),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                str(self.rdzv_endpoint),
                "--rdzv-conf",
                f"join_timeout={self.rdzv_timeout:g}",
            ]
        # Each rank writes its own stdout/stderr files, which we follow: lines never merge.
        cmd += ["--max-restarts", str(self.max_restarts), "--log-dir", str(self.log_dir), "--redirects", "3"]
        # "--": the script's own options never reach torchrun's parser ("--max" is not "--max-restarts")
        return [*cmd, "--", str(self.script), *self.script_args]

    def environment(self) -> dict[str, str]:
        from .torchrun_agent import GRACE_ENV

        env = dict(os.environ)
        # torchrun would set 1 thread per worker and warn; share the cores out instead.
        env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(self.nproc)))  # type: ignore[arg-type]
        env.update(
            PYTHONUNBUFFERED="1",  # a worker's print reaches its log file, and the cell, at once
            PYTHONFAULTHANDLER="1",  # a segfault still leaves a Python stack in stderr
            DDP_BACKEND=self.backend,
            DDP_DEVICE=self.device,
            DDP_RUN_DIR=str(self.run_dir),  # where workers write metrics/ and summary.json
        )
        env[GRACE_ENV] = f"{self.grace_s:g}"
        if self.launcher == "python":
            # what torchrun would give a world of one, so the same script runs unchanged
            env.update(
                RANK="0",
                LOCAL_RANK="0",
                WORLD_SIZE="1",
                LOCAL_WORLD_SIZE="1",
                GROUP_RANK="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(free_port()),
                TORCHELASTIC_ERROR_FILE=str(self.direct_log_dir / "error.json"),  # for @record
            )
        if self.max_restarts > 0:
            # torchrun keeps one shared TCPStore across restart rounds, so restarted workers can read
            # the dead workers' addresses and fail with "connectFullMesh ... Connection refused"
            # (seen on torch 2.14; cf. pytorch/pytorch#167288). A fresh store per round avoids it.
            env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        env.update(self.env)
        return env


OPTION_NAMES = tuple(
    f.name for f in fields(LaunchConfig) if f.init and f.name not in ("script", "script_args")
)


def options_signature(leading: list[inspect.Parameter]) -> inspect.Signature:
    """`leading` parameters, then every launch option as a keyword with `LaunchConfig`'s default.

    `launch(script, *args, **options)` keeps one source of defaults; this gives it back the signature
    that Jupyter's Shift-Tab and `help()` show.
    """
    options = []
    for f in fields(LaunchConfig):
        if f.name in OPTION_NAMES:
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            options.append(
                inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=f.type)
            )
    return inspect.Signature([*leading, *options])


def make_config(
    script: str | os.PathLike[str], script_args: Iterable[object] = (), **options: Any
) -> LaunchConfig:
    """A `LaunchConfig` from `launch()`'s arguments. Raises `InvalidLaunchArguments` saying what to change."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise InvalidLaunchArguments(
            f"unknown option(s) {unknown}; the options are {', '.join(OPTION_NAMES)}"
        )
    return LaunchConfig(Path(script), list(script_args), **options)
