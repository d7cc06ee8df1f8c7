"""One request to the ranks, from send to every reply: the cell's output echoed, deaths, hangs, Ctrl-C.

`request` is what `LiveRanks.run`, `gather` and `push` have in common. The replies are read by the
session's one receive loop; whatever ends a cell early is turned into an error by `recovery`.
"""

from __future__ import annotations

import time

from ddp_helpers.kernel.live import recovery
from ddp_helpers.kernel.live.cells import CellLog
from ddp_helpers.kernel.live.session import Session
from ddp_helpers.rank.live_protocol import Error, Exited, Reply, Request

# after a rank raised, how long the others get to finish the cell by themselves: a rank that raised
# before a collective leaves the others waiting in it until the group's timeout (30 minutes by default)
PEER_FAILED_WAIT_S = 3.0


def request(
    session: Session,
    cells: CellLog,
    message: Request,
    targets: list[int],
    timeout: float | None,
) -> dict[int, Reply]:
    """Send `message` to `targets` and return each rank's reply once all have replied.

    Raises `WorkerFailed` (or the launcher's diagnosis) if a rank died, `LaunchTimeout` if a rank
    still in the cell printed nothing for `timeout` seconds, and `LaunchInterrupted` on Ctrl-C.
    A rank that raised while others still run the cell after PEER_FAILED_WAIT_S (waiting for it in a
    collective, most often) raises `RankError` at once, the others interrupted or every rank stopped.
    """
    session.begin_cell(after_cell=cells.last_sent)
    cells.last_sent = message.cell_id
    session.send(targets, message)
    pending = set(targets)
    replies: dict[int, Reply] = {}
    started = time.monotonic()
    failed_at: float | None = None  # when the first rank's error came back

    def watch() -> None:  # between two waits: echo, and notice a dead torchrun or a silent rank
        session.follow()
        if session.agent_exit_code() is not None:
            raise recovery.died(session, None)
        if timeout is not None and pending:
            now = time.monotonic()
            stuck = [r for r in sorted(pending) if now - session.last_heard(r, started) > timeout]
            if stuck:
                raise recovery.hung(session, cells, stuck, sorted(set(replies)), timeout)
        if failed_at is not None and pending and time.monotonic() - failed_at > PEER_FAILED_WAIT_S:
            raise recovery.peer_failed(session, cells, pending, replies)

    try:
        for rank, reply in session.replies(pending, between=watch):
            if reply is None:
                raise recovery.died(session, rank)
            if isinstance(reply, Exited):  # the cell called os._exit(code)
                raise recovery.died(session, rank, exitcode=reply.code)
            replies[rank] = reply
            if isinstance(reply, Error) and failed_at is None:
                failed_at = time.monotonic()
    except KeyboardInterrupt:
        pending.difference_update(replies)  # a reply taken just before the interrupt is not pending
        raise recovery.interrupted(session, cells, pending, replies) from None
    session.end_cell()
    return replies
