"""`LaunchConfig`: one launch, checked before any process starts, and its torchrun command and environment."""

from __future__ import annotations

import copy
import os
import re
import secrets
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_helpers.backends import resolve_backend  # the one rule, shared with every worker
from ddp_helpers.errors import InvalidLaunchArguments
from ddp_helpers.kernel.launcher.machine import check_cpu_ranks, cpu_cores, free_port, visible_gpus
from ddp_helpers.kernel.launcher.options import OPTION_NAMES, OPTIONS, LaunchOptions, ranks_outside
from ddp_helpers.kernel.launcher.torchrun_agent import GRACE_ENV
from ddp_helpers.rank.stack_dumps import REGISTER_ENV, WORKER_SITE
from ddp_helpers.run_contract import AGENT_LOG, BACKEND_ENV, DEVICE_ENV, ERROR_FILE, LOGS_DIR, RUN_DIR_ENV

__all__ = ["LaunchConfig", "default_run_dir", "make_config"]

RUNS_DIR_ENV = "DDP_HELPERS_RUNS_DIR"
MULTINODE_RDZV_TIMEOUT_S = 120.0  # torchrun waits 600 s for a missing node: too long for a cell


def default_run_dir(stem: str) -> Path:
    """A new ``runs/<time>-<stem>-<id>`` (under $DDP_HELPERS_RUNS_DIR if set)."""
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}-{secrets.token_hex(3)}"
    return (Path(os.environ.get(RUNS_DIR_ENV, "runs")) / name).resolve()


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


@dataclass(frozen=True)
class LaunchConfig(LaunchOptions):
    """A script, its arguments and its options, checked (`InvalidLaunchArguments`), "auto" resolved."""

    script: Path
    script_args: list[str] = field(default_factory=list)
    gpus: int = field(init=False)  # CUDA devices this process sees, counted without a CUDA context
    device: str = field(init=False)  # "cpu" or "cuda"
    local_world_size: int = field(init=False)  # ranks on this node: nproc, or one per GPU (2 on the CPU)
    out_dir: Path = field(init=False)  # where the run writes: run_dir, or a new runs/<time>-<script>-<id>

    def __post_init__(self) -> None:
        # the checks that need no torch first: a typo is refused before `import torch` counts the GPUs
        self._check_script()
        for option in OPTIONS:
            self._set(option.name, option.check(option.name, getattr(self, option.name)))
        self._check_nodes()
        if isinstance(self.show_ranks, list) and self.nproc is not None:
            ranks_outside("show_ranks", self.show_ranks, self.nproc * self.nnodes)
        self._set("gpus", visible_gpus())
        self._resolve_world()
        if isinstance(self.show_ranks, list):  # else "all" or "none", once checked
            ranks_outside("show_ranks", self.show_ranks, self.world_size)
        self._set(
            "out_dir", Path(self.run_dir) if self.run_dir is not None else default_run_dir(self.script.stem)
        )

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # while validating: the dataclass is frozen

    def derive(self, **changes: Any) -> LaunchConfig:
        """A copy with some fields changed (live ranks), not checked again."""
        new = copy.copy(self)
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        return new

    def _check_script(self) -> None:
        script = Path(self.script).expanduser()
        if script.is_dir():
            raise InvalidLaunchArguments(f"script {script} is a directory: pass the Python file to run in it")
        if not script.is_file():
            raise InvalidLaunchArguments(f"script not found: {script} (cwd is {Path.cwd()})")
        if script.suffix == ".ipynb":  # its JSON would run as Python and fail on every rank
            raise InvalidLaunchArguments(
                f"{script.name} is a notebook, not a script: torchrun runs Python files. Write the cell "
                f"with %%writefile, or export it: jupyter nbconvert --to script {script.name}"
            )
        self._set("script", script.resolve())

    def _check_nodes(self) -> None:
        if self.node_rank >= self.nnodes:
            raise InvalidLaunchArguments(f"node_rank must be < nnodes ({self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and not (
            isinstance(self.rdzv_endpoint, str) and re.fullmatch(r"[^\s:]+:\d+", self.rdzv_endpoint)
        ):
            raise InvalidLaunchArguments(
                f"nnodes={self.nnodes} needs rdzv_endpoint='host:port', got {self.rdzv_endpoint!r}"
            )
        if self.rdzv_timeout is None and self.nnodes > 1:
            self._set("rdzv_timeout", MULTINODE_RDZV_TIMEOUT_S)

    def _resolve_world(self) -> None:
        try:
            backend, device = resolve_backend(self.backend, self.gpus)
            self._set("backend", backend)
            self._set("device", device)
        except ValueError as err:
            raise InvalidLaunchArguments(str(err)) from None
        nproc = self.nproc or (1 if self.launcher == "python" else self.gpus or 2)
        self._set("local_world_size", nproc)
        if self.device == "cpu":
            check_cpu_ranks(nproc)
        if self.backend == "nccl" and nproc > self.gpus:
            raise InvalidLaunchArguments(
                f"nproc={nproc} but only {self.gpus} GPU(s) are visible: NCCL needs one GPU per process. "
                f"Use nproc<={self.gpus}, or backend='gloo' to run on the CPU"
            )
        if self.launcher == "python" and (nproc != 1 or self.nnodes != 1 or self.max_restarts):
            raise InvalidLaunchArguments(
                "launcher='python' runs one process without torchrun's agent: it needs nproc=1, nnodes=1 and "
                f"max_restarts=0 (got nproc={nproc}, nnodes={self.nnodes}, max_restarts={self.max_restarts})"
            )

    @property
    def log_dir(self) -> Path:
        return self.out_dir / LOGS_DIR

    @property
    def agent_log(self) -> Path:
        return self.log_dir / AGENT_LOG

    @property
    def rank_offset(self) -> int:
        return self.node_rank * self.local_world_size

    @property
    def world_size(self) -> int:
        return self.local_world_size * self.nnodes

    @property
    def direct_log_dir(self) -> Path:
        """A ``launcher="python"`` run's logs, in torchrun's layout: one reader serves both."""
        return self.log_dir / "python" / "attempt_0" / "0"

    def command(self) -> list[str]:
        if self.launcher == "python":
            return [sys.executable, str(self.script), *self.script_args]
        return [sys.executable, "-m", "ddp_helpers.kernel.launcher.torchrun_agent", *self.agent_args()]

    def agent_args(self) -> list[str]:
        cmd = ["--nproc-per-node", str(self.local_world_size)]
        if self.nnodes == 1:
            cmd += ["--standalone"]  # c10d rendezvous on a free localhost port: no clashes
        else:  # rdzv_endpoint is host:port, checked: no spaces
            cmd += (
                f"--nnodes {self.nnodes} --node-rank {self.node_rank} --rdzv-backend c10d "
                f"--rdzv-endpoint {self.rdzv_endpoint} --rdzv-conf join_timeout={self.rdzv_timeout:g}"
            ).split()
        # each rank writes its own stdout/stderr files, which we follow: lines never merge
        cmd += ["--max-restarts", str(self.max_restarts), "--log-dir", str(self.log_dir), "--redirects", "3"]
        # "--": the script's own options never reach torchrun's parser ("--max" is not "--max-restarts")
        return [*cmd, "--", str(self.script), *self.script_args]

    def environment(self) -> dict[str, str]:
        env = base_environment()
        # torchrun would set 1 thread per worker and warn; share the cores out instead.
        env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(self.local_world_size)))
        env.update({BACKEND_ENV: self.backend, DEVICE_ENV: self.device, RUN_DIR_ENV: str(self.out_dir)})
        env[GRACE_ENV] = f"{self.grace_s:g}"  # torchrun_agent reads it
        if self.launcher == "python":
            # what torchrun would give a world of one (and @record's error file): the same script runs
            env.update(RANK="0", LOCAL_RANK="0", GROUP_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            env["TORCHELASTIC_ERROR_FILE"] = str(self.direct_log_dir / ERROR_FILE)
        if self.max_restarts > 0:
            # torchrun keeps one shared TCPStore across restart rounds, so restarted workers can read
            # the dead workers' addresses: "connectFullMesh ... Connection refused" (torch 2.14;
            # cf. pytorch/pytorch#167288). A fresh store per round avoids it.
            env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        env.update(self.env)
        env["PYTHONPATH"] = with_worker_site(env.get("PYTHONPATH"))  # a PYTHONPATH of the user's too
        return env


def threads_per_rank(local_world_size: int, cores: int | None = None) -> int:
    """OMP threads per rank: the cores shared out (a GPU rank's CPU work oversubscribes them too)."""
    return max(1, (cpu_cores() if cores is None else cores) // max(1, local_world_size))


def base_environment() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",  # a worker's print reaches its log file, and the cell, at once
        "PYTHONFAULTHANDLER": "1",  # a segfault still leaves a Python stack in stderr
        # every rank registers for stack dumps before its script's first line (worker_site/sitecustomize.py);
        # here, not per run, so that the agent server started with this environment serves the runs
        REGISTER_ENV: "1",
        "PYTHONPATH": with_worker_site(os.environ.get("PYTHONPATH")),
    }


def with_worker_site(pythonpath: str | None) -> str:
    rest = [entry for entry in (pythonpath or "").split(os.pathsep) if entry and entry != str(WORKER_SITE)]
    return os.pathsep.join([str(WORKER_SITE), *rest])


def make_config(
    script: str | os.PathLike[str], script_args: Iterable[object] = (), **options: Any
) -> LaunchConfig:
    """A `LaunchConfig` from `launch()`'s arguments."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise InvalidLaunchArguments(
            f"unknown option(s) {unknown}; the options are {', '.join(OPTION_NAMES)}"
        )
    return LaunchConfig(Path(script), _check_script_args(script_args), **options)
