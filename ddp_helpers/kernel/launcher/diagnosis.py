"""Which rank failed and why, after torchrun exits with an error: from torchrun's "Root Cause" report, the
rank's ``@record`` error file, or else its stderr (the last traceback, a segfault's stack, its last lines)."""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, field

from ddp_helpers.kernel.launcher.log_follow import RankLogTail
from ddp_helpers.run_contract import ERROR_FILE, STDERR_LOG

_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)"
    r".*?exitcode\s*:\s*(?P<exitcode>-?\d+)",
    re.DOTALL,
)
_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(?P<exitcode>-?\d+)"
)
# torch (>= 2.3) prefixes every line of an uncaught exception in a process-group member with
# "[rankN]: " (its excepthook in init_process_group); its C++ warnings read "[rankN]:[W...".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?", re.MULTILINE)
# glog-style lines of torch's C++ logging ("[W1130 04:12:00.123 ...]", "E1130 ..."): noise, not a reason.
_LOG_NOISE = re.compile(r"^\[?[WEIF]\d{4} \d\d:\d\d:\d\d")
# Errors a rank gets because *another* rank died first: never the root cause if a better one exists
# (torchrun stops the survivors with SIGTERM once one rank fails).
_SECONDARY = re.compile(
    "connection (reset|closed) by peer|remote worker|broken pipe|communicator was aborted|failed to recv|"
    "connectfullmesh|socket closed|killed by signal sigterm",
    re.IGNORECASE,
)
STDERR_TAIL_LINES = 8
NO_STDIN_HINT = (
    "pdb quit: a rank that launch() or start_ranks() starts has no terminal, so breakpoint() read end-of-file. "
    "On live ranks, print a cell's names in the next %%ranks cell, or call ranks.where() for every rank's "
    "stack; pdb needs torchrun started from a terminal (torch.distributed.breakpoint(rank=0))."
)


def pdb_quit_hint(error: str) -> str:
    """The hint's paragraph for a live rank's "BdbQuit: ..." error, or ""."""
    return f"\n\nhint: {NO_STDIN_HINT}" if error.startswith("BdbQuit") else ""


@dataclass
class Diagnosis:
    rank: int
    exitcode: int
    error: str  # "Type: message", or the signal and its reason; "" until diagnose() says more
    traceback: str
    hint: str = ""
    stderr_tail: str = ""  # the rank's last stderr lines, when they are the only explanation
    left_early: list[int] = field(default_factory=list)  # ranks that exited with code 0 first: the cause


def strip_rank_prefix(text: str) -> str:
    return _RANK_PREFIX.sub("", text)


def _last_traceback(stderr_text: str) -> tuple[str, str]:
    """The last Python traceback in a stderr log, and its final "Type: message" line."""
    start = stderr_text.rfind("Traceback (most recent call last):")
    if start < 0:
        return "", ""
    lines = stderr_text[start:].splitlines()
    # the first unindented line after the header is the exception
    for i, line in enumerate(lines[1:], start=1):
        if line and not line.startswith((" ", "\t")):
            # a multi-line message goes on until a blank line or torch's own logging
            end = i + 1
            while end < len(lines) and lines[end].strip() and not lines[end].startswith(("[", "W", "E")):
                end += 1
            return "\n".join(lines[:end]), line.strip()
    return "\n".join(lines), lines[-1].strip()


def _fault_stack(stderr_text: str, max_lines: int = 60) -> str:
    """faulthandler's report of a fatal signal (every thread's Python stack), if there is one."""
    start = stderr_text.rfind("Fatal Python error:")
    if start < 0:
        return ""
    lines = stderr_text[start:].splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("Extension modules:")), len(lines))
    return "\n".join(lines[: min(end, max_lines)]).rstrip()


def stderr_tail(stderr_text: str, count: int = STDERR_TAIL_LINES) -> str:
    """The rank's last stderr lines that are not torch's logging: what ``sys.exit("...")`` printed."""
    lines = [line.rstrip() for line in stderr_text.splitlines()]
    meaningful = [line for line in lines if line.strip() and not _LOG_NOISE.match(line.lstrip())]
    return "\n".join(meaningful[-count:])


def _from_error_file(tail: RankLogTail, rank: int) -> tuple[str, str]:
    """The message and Python stack that ``@record`` wrote (torchelastic's ErrorHandler.record_exception)."""
    path = tail.rank_file(rank, ERROR_FILE)
    try:
        message = json.loads(path.read_text())["message"] if path is not None else ""
        if isinstance(message, str):
            return message, ""
        return str(message.get("message", "")), str(message.get("extraInfo", {}).get("py_callstack", ""))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # half-written or foreign file
        return "", ""


def _signal_text(exitcode: int) -> str:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    name = ProcessFailure(local_rank=0, pid=0, exitcode=exitcode, error_file="").signal_name()
    return f"killed by signal {name if name != '<N/A>' else -exitcode}"


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
    if _SECONDARY.search(error):
        return "this rank lost a peer or was stopped: another rank exited or crashed first; check the other ranks' logs."
    if "address already in use" in lowered:
        return "the rendezvous port is taken; launch() picks a free one unless rdzv_endpoint pins it."
    if "bdbquit" in lowered:
        return NO_STDIN_HINT
    return ""


def rank_stderr(tail: RankLogTail, rank: int, since: int = 0) -> str:
    """What global `rank` wrote to stderr from byte `since` on, torch's "[rankN]: " prefixes removed."""
    path = tail.rank_file(rank, STDERR_LOG)
    return strip_rank_prefix(path.read_bytes()[since:].decode(errors="replace")) if path else ""


def _rank_report(tail: RankLogTail, rank: int, exitcode: int, since: int = 0) -> Diagnosis:
    """This rank's exception line and traceback, from its error file or else its stderr (from byte `since`)."""
    error, traceback = _from_error_file(tail, rank)  # the latest attempt made torchrun give up
    stderr_text = rank_stderr(tail, rank, since)
    if not traceback:
        traceback, last_line = _last_traceback(stderr_text)
        error = error or last_line
    if exitcode < 0 and not error:
        # a signal and no Python exception: a C++ abort often says why ("what(): ..."), and
        # faulthandler (PYTHONFAULTHANDLER=1) leaves the Python stack of a segfault
        what = _cxx_what(stderr_text)
        traceback = _fault_stack(stderr_text)
        error = _signal_text(exitcode) + (f": {what}" if what else "") + _when_no_python_ran(traceback)
    return Diagnosis(rank, exitcode, error, traceback, stderr_tail="" if error else stderr_tail(stderr_text))


def _cxx_what(stderr_text: str) -> str:
    """What a C++ abort said: an exception's ``what()``, or else libstdc++'s "terminate called ..." line."""
    lines = [line.strip() for line in stderr_text.splitlines() if "what():" in line]
    if lines:
        return lines[-1].split("what():", 1)[1].strip()
    lines = [line.strip() for line in stderr_text.splitlines()]
    terminate = [line for line in lines if line.startswith("terminate called")]
    return terminate[-1] if terminate else ""


def _when_no_python_ran(fault_stack: str) -> str:
    """Say so when no thread ran Python code as the rank died (torch 2.14, gloo: pytorch/pytorch#190489)."""
    if "<no Python frame>" not in fault_stack or "Current thread" in fault_stack or 'File "' in fault_stack:
        return ""
    return (
        ", in a native thread while no thread ran Python code (the main thread had no Python frame):"
        " most likely as the interpreter exited, after the script's last line"
    )


def diagnose(
    agent_output: str,
    tail: RankLogTail,
    nranks: int,
    cuda_available: bool,
    exitcodes: dict[int, int] | None = None,
    stderr_since: dict[int, int] | None = None,
) -> Diagnosis | None:
    """Find the failing rank. Returns None when no worker can be blamed."""
    since = stderr_since or {}
    exitcodes = {
        **(exitcodes or {}),
        **{int(m["rank"]): int(m["exitcode"]) for m in _FAILURE.finditer(agent_output)},
    }
    rank: int | None = None
    match = _ROOT_CAUSE.search(agent_output)
    if match:
        rank = int(match["rank"])
        exitcodes.setdefault(rank, int(match["exitcode"]))
    candidates = sorted(set(exitcodes) | set(tail.global_ranks(nranks)))
    reports = {r: _rank_report(tail, r, exitcodes.get(r, 1), since.get(r, 0)) for r in candidates}
    if rank is None:
        # no report (e.g. torchrun itself was killed): blame a rank that left a traceback
        rank = next((r for r in candidates if reports[r].error), None)
    if rank is None and len(exitcodes) == 1:
        rank = next(iter(exitcodes))  # the one known failure, even without a traceback
    if rank is None:
        return None
    # torchrun's "first observed" failure can be a rank that only lost its peer: prefer the one that
    # failed for a reason of its own (error-file timestamps have one-second resolution)
    primary = [r for r in candidates if reports[r].error and not _SECONDARY.search(reports[r].error)]
    left: list[int] = []
    if _SECONDARY.search(reports[rank].error) and primary:
        rank = primary[0]
    elif _SECONDARY.search(reports[rank].error) and match:
        # then the cause is a rank that exited with code 0 and left `rank` waiting: torchrun's report lists
        # only the ranks that failed (its SubprocessContext._poll counts exit code 0 as done)
        left = [r for r in candidates if r not in exitcodes and r != rank]
    found = reports[rank]
    if not found.error:
        said = found.stderr_tail.splitlines()[-1].strip() if found.stderr_tail else ""
        found.error = f"exited with code {found.exitcode}" + (
            f": {said}" if said else " and left no traceback"
        )
    found.hint = UNEVEN_HINT if left else _hint(found.error, found.exitcode, cuda_available)
    found.left_early = left
    return found


UNEVEN_HINT = (
    "uneven inputs (a different number of steps per rank) or a skipped collective. Give every rank the "
    "same number of steps (DistributedSampler(drop_last=True)) or wrap the loop in Join."
)


# torch 2.7 joins gloo's threads in ~ProcessGroupGloo holding the GIL, which a gloo thread freeing a finished
# collective's tensors waits for; pytorch/pytorch#154976 releases it, from torch 2.8
GLOO_DESTROY_FIXED_IN = (2, 8)


def destroy_deadlock_note(stacks: dict[int, str], backend: str, torch_version: str) -> str:
    """Advice for ranks stuck in destroy_process_group() on torch 2.7's gloo, where that is torch's bug."""
    version = re.match(r"(\d+)\.(\d+)", torch_version)
    stuck = [
        r for r, stack in sorted(stacks.items()) if "destroy_process_group" in "".join(stack.splitlines()[:2])
    ]
    fixed = version is None or tuple(map(int, version.groups())) >= GLOO_DESTROY_FIXED_IN
    if backend != "gloo" or fixed or not stuck:
        return ""
    return (
        f"rank(s) {', '.join(map(str, stuck))} wait in destroy_process_group(): on torch {torch_version} with "
        "gloo it can deadlock on the GIL (fixed in 2.8, pytorch/pytorch#154976). Hold gloo's backend until "
        "the destroy returns, as ddp.py's teardown() does."
    )
