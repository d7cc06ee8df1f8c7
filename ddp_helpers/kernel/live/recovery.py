"""When a cell does not end by itself (a kernel interrupt, a hang, a dead rank): the launcher's errors, and
the ranks left usable (every rank left the cell and a barrier completes) or stopped, never in between.
Where a stuck rank waits comes from its stack dump (`rank/stack_dumps.py`), with the cells' lines."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import psutil

from ddp_helpers.errors import LaunchError, LaunchInterrupted, LaunchTimeout, RankError, WorkerFailed
from ddp_helpers.kernel.live.results import failure_text
from ddp_helpers.rank import stack_dumps
from ddp_helpers.rank.live_protocol import Error, Reply, Run, Value

if TYPE_CHECKING:
    from ddp_helpers.kernel.live.ranks import LiveRanks

INTERRUPT_WAIT_S = 5.0  # how long an interrupted rank gets to come back before the ranks are stopped
CHECK_TIMEOUT_S = 10.0  # the barrier that tells whether an interrupt left the process group usable
EXIT_REPORT_WAIT_S = 1.0  # torchrun polls its workers every 0.1 s: a failure is reported well within this
RESTART_HINT = "`%ranks restart` (or `ranks.restart()`) starts them afresh, with the same options."


def _listed(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def interrupted(ranks: LiveRanks, pending: set[int], replies: dict[int, Reply]) -> LaunchInterrupted:
    """Ctrl-C in the kernel: interrupt the ranks still in the cell, keep them if the group survived."""
    if not interrupt(ranks, pending, replies):
        ranks.stop()
        return LaunchInterrupted(
            f"interrupted: rank(s) {_listed(sorted(pending))} did not return from the cell within "
            f"{INTERRUPT_WAIT_S:g}s (a rank blocked inside a collective cannot be interrupted), so every "
            f"rank was stopped. {RESTART_HINT}"
        )
    return LaunchInterrupted(check_group(ranks, "interrupted: every rank stopped the cell"))


def interrupt(ranks: LiveRanks, pending: set[int], replies: dict[int, Reply]) -> bool:
    """SIGINT the ranks in `pending` (never torchrun's agent); True if each came back in INTERRUPT_WAIT_S."""
    for rank in pending:
        try:
            os.kill(ranks.pids[rank], signal.SIGINT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + INTERRUPT_WAIT_S
    for rank, reply in ranks.replies(pending, deadline, between=ranks.follow):
        if reply is None:
            return False
        replies[rank] = reply
    ranks.follow(final=True)
    return not pending


def check_group(ranks: LiveRanks, what: str) -> str:
    """A barrier with a deadline: after an interrupt, is the process group still usable?"""
    ranks.send(ranks.conns, Run(ranks.new_cell("dist.barrier()"), "dist.barrier()"))
    pending = set(ranks.conns)
    for _rank, reply in ranks.replies(pending, time.monotonic() + CHECK_TIMEOUT_S):
        if not isinstance(reply, Value):
            break  # broken for sure: this rank stays pending
    if pending:
        ranks.stop()
        return (
            f"{what}, but the process group is no longer usable (a barrier did not complete within "
            f"{CHECK_TIMEOUT_S:g}s: a collective was cut short on some rank). The ranks were stopped: "
            f"{RESTART_HINT}"
        )
    return f"{what}; the ranks are still running, with their state, and the process group is usable."


def where(ranks: LiveRanks) -> str:
    """Every rank's Python stack now (`%ranks where`); a rank with no cell frame is between cells."""
    parts = []
    for rank, stack in sorted(read_stacks(ranks, sorted(ranks.pids)).items()):
        if 'File "<cell ' not in stack:
            parts.append(f"rank {rank}: between cells (waiting for the next one)")
        else:
            parts.append(f"rank {rank}, running (most recent call first):\n{stack}")
    return "\n\n".join(parts) or "no rank answered"


def peer_failed(ranks: LiveRanks, pending: set[int], replies: dict[int, Reply]) -> RankError:
    """Some ranks raised while the rest still run the cell: where they wait, then interrupt them."""
    failed = {r: reply for r, reply in replies.items() if isinstance(reply, Error)}
    waiting = sorted(pending)
    why = "blocked inside a collective that the failed rank never joined"
    lines, _ = _waiting_then_interrupted(
        ranks, waiting, "was still in the cell, waiting", f"Rank(s) {_listed(waiting)}", why
    )
    return RankError(
        "\n".join([failure_text(failed), *lines]), errors={r: e.traceback for r, e in failed.items()}
    )


def hung(ranks: LiveRanks, stuck: list[int], finished: list[int], timeout: float) -> LaunchTimeout:
    """Ranks silent in the cell for `timeout`: show where each waits, then interrupt them, or stop all."""
    lines = [
        f"the cell hung: rank(s) {_listed(stuck)} printed nothing for {timeout:g}s and did not finish the cell.",
        f"ranks that finished the cell: {_listed(finished) or 'none'}",
    ]
    why = "they are blocked inside a collective"
    more, stacks = _waiting_then_interrupted(ranks, stuck, "is waiting", "The stuck ranks", why, RESTART_HINT)
    return LaunchTimeout(
        "\n".join(lines + more), silent_ranks=stuck, run_dir=str(ranks.config.out_dir), stacks=stacks
    )


def _waiting_then_interrupted(
    ranks: LiveRanks, waiting: list[int], waits: str, who: str, why: str, hint: str = ""
) -> tuple[list[str], dict[int, str]]:
    """Where each of `waiting` waits, then the outcome of interrupting them: usable ranks, or all stopped."""
    stacks = read_stacks(ranks, waiting)
    lines = []
    for rank in waiting:
        lines += ["", f"rank {rank} {waits} here (most recent call first):", stacks.get(rank, "  (no stack)")]
    if interrupt(ranks, set(waiting), {}):
        lines += ["", check_group(ranks, f"{who} were interrupted")]
    else:
        ranks.stop()
        lines += [
            "",
            f"{who} did not answer an interrupt within {INTERRUPT_WAIT_S:g}s ({why}), so every rank was "
            f"stopped. {hint}".rstrip(),
        ]
    return lines, stacks


def died(ranks: LiveRanks, rank: int | None, exitcode: int | None = None) -> LaunchError:
    """A rank is gone: say who left, with which code, and what this cell wrote; stop the rest."""
    # `exitcode` is known when the cell called os._exit. torchrun reports a rank that failed, never one
    # that exited 0: a rank gone while torchrun runs on and says nothing left with code 0
    if exitcode is None:
        exitcode = _silent_exit(ranks, rank)
    ranks.follow(final=True)
    returncode = ranks.agent_exit_code()
    error: LaunchError
    if exitcode is None and returncode not in (None, 0):
        error = ranks.follower.failure(returncode, stderr_since=ranks.stderr_at)
    else:
        error = WorkerFailed(
            rank if rank is not None else -1,
            exitcode if exitcode is not None else -1,
            f"exited with code {exitcode} during the cell"
            if exitcode is not None
            else "the rank's connection closed without a report from torchrun",
            "",
            run_dir=str(ranks.config.out_dir),
            stderr_tail="\n".join(ranks.cell_stderr(rank)),
        )
    ranks.stop()
    message = str(error)
    if (
        exitcode is not None
    ):  # not a failure of its own making, maybe: it left, and the others could not go on
        message = message.replace(f"rank {rank} failed: exited", f"rank {rank} exited", 1)
    error.args = (f"{message}\n\nThe other ranks were stopped: {RESTART_HINT}",)
    return error


def _silent_exit(ranks: LiveRanks, rank: int | None) -> int | None:
    """0 if `rank`'s process is gone while torchrun runs on without a report; else None."""
    pid = ranks.pids.get(rank) if rank is not None else None
    deadline = time.monotonic() + ranks.config.grace_s + 10
    gone_since: float | None = None
    while ranks.agent_exit_code() is None and time.monotonic() < deadline:
        if pid is not None and not _running(pid):
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > EXIT_REPORT_WAIT_S:
                return 0
        time.sleep(0.02)
    return None


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def read_stacks(ranks: LiveRanks, which: list[int]) -> dict[int, str]:
    """Each rank's current Python stack (most recent call first), with the cells' lines."""
    pids = {r: ranks.pids[r] for r in which if r in ranks.pids}
    dumps = stack_dumps.ask_dumps(pids, ranks.config.log_dir)
    return {rank: format_stack(stack_dumps.main_thread(dump), ranks.sources) for rank, dump in dumps.items()}


def format_stack(dump: str, sources: Mapping[int, str]) -> str:
    """A faulthandler dump, down to the innermost cell frame, each cell frame followed by its line."""
    frames = list(_FRAME.finditer(dump))
    cell_frames = [i for i, m in enumerate(frames) if m["file"].startswith("<cell ")]
    if cell_frames:
        frames = frames[: cell_frames[-1] + 1]  # drop the server's own frames below the cell
    out = []
    for m in frames:
        out.append(f'  File "{m["file"]}", line {m["line"]} in {m["func"]}')
        cell = re.fullmatch(r"<cell (\d+)>", m["file"])
        source = sources.get(int(cell[1]), "").splitlines() if cell else []
        if 0 < int(m["line"]) <= len(source):
            out.append(f"    {source[int(m['line']) - 1].strip()}")
    return "\n".join(out)
