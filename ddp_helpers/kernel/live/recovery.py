"""When a cell does not end by itself: a kernel interrupt, a hang, a rank that died."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Mapping

import psutil

from ddp_helpers.errors import LaunchError, LaunchInterrupted, LaunchTimeout, RankError, WorkerFailed
from ddp_helpers.kernel.live.results import failure_text
from ddp_helpers.kernel.live.session import POLL_S, CellLog, Session
from ddp_helpers.rank import stack_dumps
from ddp_helpers.rank.live_protocol import Check, Error, Reply, Value

INTERRUPT_WAIT_S = 5.0  # how long an interrupted rank gets to come back before the ranks are stopped
CHECK_TIMEOUT_S = 10.0  # the barrier that tells whether an interrupt left the process group usable
EXIT_REPORT_WAIT_S = 1.0  # torchrun polls its workers every 0.1 s: a failure is reported well within this
RESTART_HINT = "`%ranks restart` (or `ranks.restart()`) starts them afresh, with the same options."


# ------------------------------------------------------------------ interrupts
def interrupted(
    session: Session, cells: CellLog, pending: set[int], replies: dict[int, Reply]
) -> LaunchInterrupted:
    """Ctrl-C in the kernel: interrupt the ranks still in the cell, keep them if the group survived."""
    if not interrupt(session, pending, replies):
        session.stop()
        return LaunchInterrupted(
            f"interrupted: rank(s) {', '.join(map(str, sorted(pending)))} did not return from the cell within "
            f"{INTERRUPT_WAIT_S:g}s (a rank blocked inside a collective cannot be interrupted), so every "
            f"rank was stopped. {RESTART_HINT}"
        )
    return LaunchInterrupted(check_group(session, cells, "interrupted: every rank stopped the cell"))


def interrupt(session: Session, pending: set[int], replies: dict[int, Reply]) -> bool:
    """SIGINT the ranks in `pending`; True if each came back within INTERRUPT_WAIT_S."""
    session.signal(pending, signal.SIGINT)
    deadline = time.monotonic() + INTERRUPT_WAIT_S
    for rank, reply in session.replies(pending, deadline, between=session.follow):
        if reply is None:
            return False
        replies[rank] = reply
    session.follow(final=True)
    return not pending


def check_group(session: Session, cells: CellLog, what: str) -> str:
    """A barrier with a deadline: after an interrupt, is the process group still usable?"""
    check = Check(cells.new(""))
    session.send(session.links, check)
    pending = set(session.links)
    for _rank, reply in session.replies(pending, time.monotonic() + CHECK_TIMEOUT_S):
        if not isinstance(reply, Value):
            break  # broken for sure: this rank stays pending
    if pending:
        session.stop()
        return (
            f"{what}, but the process group is no longer usable (a barrier did not complete within "
            f"{CHECK_TIMEOUT_S:g}s: a collective was cut short on some rank). The ranks were stopped: "
            f"{RESTART_HINT}"
        )
    return f"{what}; the ranks are still running, with their state, and the process group is usable."


# ------------------------------------------------------------------ where every rank is
def where(session: Session, cells: CellLog) -> str:
    """Every rank's Python stack now (`%ranks where`)."""
    return show_stacks(read_stacks(session, sorted(session.links), cells.sources))


# ------------------------------------------------------------------ a rank raised, or some ranks hang
def peer_failed(session: Session, cells: CellLog, pending: set[int], replies: dict[int, Reply]) -> RankError:
    """Some ranks raised and the rest still run the cell (most often waiting for them in a collective):
    say where the rest wait, then interrupt them, and keep the ranks if the group survived; else stop them
    (the caller starts fresh ones)."""
    failed = {r: reply for r, reply in replies.items() if isinstance(reply, Error)}
    waiting = sorted(pending)
    lines = [failure_text(failed)]
    who = f"Rank(s) {', '.join(map(str, waiting))}"
    why = "blocked inside a collective that the failed rank never joined"
    lines += _waiting_then_interrupted(session, cells, waiting, "was still in the cell, waiting", who, why)[0]
    return RankError("\n".join(lines), errors={r: reply.traceback for r, reply in failed.items()})


def hung(
    session: Session, cells: CellLog, stuck: list[int], finished: list[int], timeout: float
) -> LaunchTimeout:
    """Ranks silent in the cell for `timeout`: show where each waits, then interrupt them, or stop all."""
    lines = [
        f"the cell hung: rank(s) {', '.join(map(str, stuck))} printed nothing for {timeout:g}s "
        f"and did not finish the cell.",
        f"ranks that finished the cell: {', '.join(map(str, finished)) or 'none'}",
    ]
    why = "they are blocked inside a collective"
    more, stacks = _waiting_then_interrupted(
        session, cells, stuck, "is waiting", "The stuck ranks", why, RESTART_HINT
    )
    return LaunchTimeout(
        "\n".join(lines + more), silent_ranks=stuck, run_dir=str(session.config.out_dir), stacks=stacks
    )


def _waiting_then_interrupted(
    session: Session, cells: CellLog, ranks: list[int], waits: str, who: str, why: str, hint: str = ""
) -> tuple[list[str], dict[int, str]]:
    """Where each of `ranks` waits, then the outcome of interrupting them: usable ranks, or every rank stopped."""
    stacks = read_stacks(session, ranks, cells.sources)
    lines = []
    for rank in ranks:
        lines += ["", f"rank {rank} {waits} here (most recent call first):", stacks.get(rank, "  (no stack)")]
    if interrupt(session, set(ranks), {}):
        lines += ["", check_group(session, cells, f"{who} were interrupted")]
    else:
        session.stop()
        lines += [
            "",
            f"{who} did not answer an interrupt within {INTERRUPT_WAIT_S:g}s ({why}), so every rank was "
            f"stopped. {hint}".rstrip(),
        ]
    return lines, stacks


# ------------------------------------------------------------------ deaths
def died(session: Session, rank: int | None, exitcode: int | None = None) -> LaunchError:
    """A rank is gone: say who left, with which code, and what this cell wrote; stop the rest."""
    # torchrun reports a rank that failed, never one that exited 0: a rank gone while torchrun runs on
    # and says nothing left with code 0
    if exitcode is None:
        exitcode = _silent_exit(session, rank)
    session.follow(final=True)
    returncode = session.agent_exit_code()
    error: LaunchError
    if exitcode is None and returncode not in (None, 0):
        error = session.run.failure(returncode, stderr_since=session.stderr_at)
    else:
        error = WorkerFailed(
            rank if rank is not None else -1,
            exitcode if exitcode is not None else -1,
            f"exited with code {exitcode} during the cell"
            if exitcode is not None
            else "the rank's connection closed without a report from torchrun",
            "",
            run_dir=str(session.config.out_dir),
            stderr_tail="\n".join(session.cell_stderr(rank)),
        )
    session.stop()
    message = str(error)
    if (
        exitcode is not None
    ):  # not a failure of its own making, maybe: it left, and the others could not go on
        message = message.replace(f"rank {rank} failed: exited", f"rank {rank} exited", 1)
    message += f"\n\nThe other ranks were stopped: {RESTART_HINT}"
    error.args = (message,)
    return error


def _silent_exit(session: Session, rank: int | None) -> int | None:
    """0 if `rank`'s process is gone while torchrun runs on without a report; None once torchrun has ended
    (it reports) or after its grace time."""
    pid = session.links[rank].pid if rank is not None and rank in session.links else None
    deadline = time.monotonic() + session.config.grace_s + 10
    gone_since: float | None = None
    while session.agent_exit_code() is None and time.monotonic() < deadline:
        if pid is not None and not _running(pid):
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > EXIT_REPORT_WAIT_S:
                return 0
        time.sleep(POLL_S)
    return None


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------------------------ stacks
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def read_stacks(session: Session, ranks: list[int], sources: Mapping[int, str]) -> dict[int, str]:
    """Each rank's current Python stack (most recent call first), with the cells' lines from `sources`."""
    pids = {r: session.links[r].pid for r in ranks if r in session.links}
    dumps = stack_dumps.ask_dumps(pids, session.config.log_dir)
    return {rank: format_stack(stack_dumps.main_thread(dump), sources) for rank, dump in dumps.items()}


def show_stacks(stacks: Mapping[int, str]) -> str:
    """Each rank's stack under a heading; a rank with no cell frame is between cells."""
    parts = []
    for rank, stack in sorted(stacks.items()):
        lines = stack.splitlines()
        in_cell = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "<cell ')]
        if not in_cell:
            parts.append(f"rank {rank}: between cells (waiting for the next one)")
            continue
        parts.append(f"rank {rank}, running (most recent call first):\n" + "\n".join(lines))
    return "\n\n".join(parts) or "no rank answered"


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
        if cell:
            source = sources.get(int(cell[1]), "").splitlines()
            number = int(m["line"])
            if 0 < number <= len(source):
                out.append(f"    {source[number - 1].strip()}")
    return "\n".join(out)
