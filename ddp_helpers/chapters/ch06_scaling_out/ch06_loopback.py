"""Several "nodes" on one machine: one agent of an elastic job as a process of its own
(`start_elastic_node`), to add, kill or `freeze` a node from a notebook."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddp_helpers.kernel.launcher.processes import ProcessTree, exit_code, wait_for_exit


@dataclass
class ElasticNode:
    """One torchrun agent of an elastic job, started in a session of its own, its output in `log`."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def lines(self) -> list[str]:
        """Every line the agent and its ranks wrote so far (rank lines start ``[rankN]:``)."""
        return self.log.read_text(errors="replace").splitlines() if self.log.exists() else []

    def stop(self, sig: int = signal.SIGKILL, timeout_s: float = 30) -> int:
        """Signal the agent and every worker it started, as a machine that dies; the agent's exit code."""
        if exit_code(self.process) is None:  # torchrun's workers have sessions of their own: the whole tree
            ProcessTree(self.process.pid).signal_all(sig)
        if not wait_for_exit(self.process, timeout_s):
            raise subprocess.TimeoutExpired(self.process.args, timeout_s)
        return self.process.returncode


def start_elastic_node(
    script: str | os.PathLike[str],
    script_args: Sequence[object] = (),
    *,
    name: str,
    nproc: int,
    min_nodes: int,
    max_nodes: int,
    rdzv_endpoint: str,
    run_id: str,
    log_dir: str | os.PathLike[str],
    max_restarts: int = 3,
    rdzv_conf: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> ElasticNode:
    """Start one agent of an elastic job: ``torchrun --nnodes min_nodes:max_nodes --max-restarts ...``."""
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    conf = ",".join(f"{key}={value}" for key, value in (rdzv_conf or {}).items())
    # --tee 3 with a [rankN]: prefix puts every rank's lines in the node's log
    options = {
        "--nnodes": f"{min_nodes}:{max_nodes}",
        "--nproc-per-node": nproc,
        "--max-restarts": max_restarts,
        "--rdzv-backend": "c10d",
        "--rdzv-endpoint": rdzv_endpoint,
        "--rdzv-id": run_id,
        **({"--rdzv-conf": conf} if conf else {}),
        "--tee": 3,
        "--log-dir": folder / f"{name}-torchelastic",
    }
    flags = [str(item) for pair in options.items() for item in pair]
    cmd = [sys.executable, "-m", "torch.distributed.run", *flags, str(script), *map(str, script_args)]
    child_env = {
        **os.environ,
        **(env or {}),
        "PYTHONUNBUFFERED": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # see config.LaunchConfig.environment
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: ",
    }
    log = folder / f"{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env, start_new_session=True
        )
    return ElasticNode(name, process, log)


def wait_for_line(nodes: Sequence[ElasticNode], pattern: str, timeout_s: float) -> re.Match[str]:
    """The first match of `pattern` in the nodes' logs, waiting up to `timeout_s`."""
    compiled = re.compile(pattern)  # a failed wait stops the nodes first: nothing outlives the cell
    deadline = time.monotonic() + timeout_s
    while True:
        for node in nodes:
            for line in node.lines():
                if match := compiled.search(line):
                    return match
        timed_out = time.monotonic() > deadline
        if timed_out or all(exit_code(node.process) is not None for node in nodes):
            for node in nodes:
                node.stop()
            tails = {node.name: node.lines()[-5:] for node in nodes}
            if timed_out:
                raise TimeoutError(
                    f"no line matched {pattern!r} within {timeout_s:g} s (nodes stopped); last lines: {tails}"
                )
            raise RuntimeError(f"every node exited before a line matched {pattern!r}; last lines: {tails}")
        time.sleep(0.2)


def freeze(node: ElasticNode) -> None:
    """SIGSTOP the node's agent and workers: alive, sockets open, silent, as a frozen machine's."""
    ProcessTree(node.process.pid).signal_all(signal.SIGSTOP)
