"""Work out which rank failed and why, after torchrun exits with an error.

Sources, best first:
1. torchrun's own report ("Root Cause (first observed failure)") for the rank and exit code;
2. the rank's torchelastic error file, written by ``@record``, for the exception and traceback;
3. the rank's stderr log, for scripts written without ``@record``.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass

from .log_tail import RankLogTail

_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)"
    r".*?exitcode\s*:\s*(?P<exitcode>-?\d+)",
    re.DOTALL,
)
_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(?P<exitcode>-?\d+)"
)
# Errors a rank gets because *another* rank died first: never the root cause if a better one exists.
_SECONDARY = (
    "connection reset by peer", "connection closed by peer", "remote worker", "broken pipe",
    "communicator was aborted", "failed to recv", "connectfullmesh", "socket closed",
    "killed by signal sigterm",  # torchrun stops the survivors with SIGTERM once one rank fails
)  # fmt: skip


@dataclass
class Diagnosis:
    rank: int
    exitcode: int
    error: str
    traceback: str
    hint: str = ""


def _last_traceback(stderr_text: str) -> tuple[str, str]:
    """The last Python traceback in a stderr log, and its final "Type: message" line."""
    start = stderr_text.rfind("Traceback (most recent call last):")
    if start < 0:
        return "", ""
    block = stderr_text[start:]
    lines = block.splitlines()
    # The traceback ends at the first unindented line after the header: that is the exception.
    for i, line in enumerate(lines[1:], start=1):
        if line and not line.startswith((" ", "\t")):
            # Chained or multi-line messages: keep going until a blank line or torch's own logging.
            end = i + 1
            while end < len(lines) and lines[end].strip() and not lines[end].startswith(("[", "W", "E")):
                end += 1
            return "\n".join(lines[:end]), line.strip()
    return block, lines[-1].strip()


def _from_error_file(tail: RankLogTail, rank: int, attempt: int | None) -> tuple[str, str]:
    path = tail.rank_file(rank, "error.json", attempt)
    if path is None:
        return "", ""
    try:
        data = json.loads(path.read_text())
        message = data["message"]
        if isinstance(message, str):
            return message, ""
        return message.get("message", ""), message.get("extraInfo", {}).get("py_callstack", "")
    except (OSError, ValueError, KeyError, AttributeError):
        return "", ""


def _signal_text(exitcode: int) -> str:
    try:
        return f"killed by signal {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"killed by signal {-exitcode}"


def _hint(error: str, exitcode: int, cuda_available: bool) -> str:
    lowered = error.lower()
    if not cuda_available and any(k in lowered for k in ("cuda", "nvidia", "nccl")):
        return (
            "this script asks for CUDA or NCCL, but this machine has no usable GPU. "
            "Pick the device from the environment instead of hard-coding it: "
            "backend = 'nccl' if torch.cuda.is_available() else 'gloo'."
        )
    if exitcode == -signal.SIGKILL:
        return "SIGKILL with no traceback is most often the kernel's out-of-memory killer (see `dmesg`)."
    if _is_secondary(error):
        return "this rank lost a peer or was stopped: another rank exited or crashed first; check the other ranks' logs."
    if "address already in use" in lowered:
        return "the rendezvous port is taken; launch() picks a free one unless rdzv_endpoint pins it."
    return ""


def _is_secondary(error: str) -> bool:
    lowered = error.lower()
    return any(marker in lowered for marker in _SECONDARY)


def _rank_error(tail: RankLogTail, rank: int, exitcode: int) -> tuple[str, str]:
    """This rank's exception line and traceback, from its error file or else its stderr."""
    error, traceback = _from_error_file(tail, rank, None)  # the latest attempt made torchrun give up
    if not traceback:
        traceback, last_line = _stderr_traceback(tail, rank)
        error = error or last_line
    if exitcode < 0 and not error:
        # a signal and no Python exception: a C++ abort often says why ("what(): ...")
        what = _cxx_what(tail, rank)
        error = _signal_text(exitcode) + (f": {what}" if what else "")
    return error, traceback


def _cxx_what(tail: RankLogTail, rank: int) -> str:
    path = tail.rank_file(rank, "stderr.log")
    if path is None:
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if "what():" in line]
    return lines[-1].split("what():", 1)[1].strip() if lines else ""


def diagnose(
    agent_output: str,
    tail: RankLogTail,
    nranks: int,
    cuda_available: bool,
    exitcodes: dict[int, int] | None = None,
) -> Diagnosis | None:
    """Find the failing rank. Returns None when no worker can be blamed.

    `exitcodes` adds rank exit codes known without torchrun's report (a run with no agent).
    """
    exitcodes = {
        **(exitcodes or {}),
        **{int(m["rank"]): int(m["exitcode"]) for m in _FAILURE.finditer(agent_output)},
    }
    rank: int | None = None
    match = _ROOT_CAUSE.search(agent_output)
    if match:
        rank = int(match["rank"])
        exitcodes.setdefault(rank, int(match["exitcode"]))
    candidates = sorted(set(exitcodes) | set(range(tail.rank_offset, tail.rank_offset + nranks)))
    errors = {r: _rank_error(tail, r, exitcodes.get(r, 1)) for r in candidates}
    if rank is None:
        # no report (e.g. torchrun itself was killed): blame a rank that left a traceback
        rank = next((r for r in candidates if errors[r][0]), None)
    if rank is None and len(exitcodes) == 1:
        rank = next(iter(exitcodes))  # the one known failure, even without a traceback
    if rank is None:
        return None
    if _is_secondary(errors[rank][0]):
        # torchrun's "first observed" failure can be a rank that only lost its peer: prefer the one
        # that failed for a reason of its own (error-file timestamps have one-second resolution)
        primary = [r for r in candidates if errors[r][0] and not _is_secondary(errors[r][0])]
        if primary:
            rank = primary[0]
    exitcode = exitcodes.get(rank, 1)
    error, traceback = errors[rank]
    error = error or f"exited with code {exitcode} and left no traceback"
    return Diagnosis(rank, exitcode, error, traceback, _hint(error, exitcode, cuda_available))


def _stderr_traceback(tail: RankLogTail, rank: int) -> tuple[str, str]:
    path = tail.rank_file(rank, "stderr.log")
    if path is None:
        return "", ""
    return _last_traceback(path.read_text(errors="replace"))
