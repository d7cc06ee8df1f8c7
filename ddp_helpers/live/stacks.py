"""Where a stuck rank waits: its Python stack, asked for with a signal, trimmed to the cell's own frames.

Each rank's server registers faulthandler on `protocol.STACK_SIGNAL`, writing to
``<run_dir>/stacks/rank<N>.txt``: a rank blocked inside a collective (in C++, where no Python code
runs) still dumps its stack, because faulthandler writes from the signal handler itself.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from . import protocol
from .session import Session

STACK_WAIT_S = 1.0
DUMP_SETTLE_S = 0.1  # faulthandler writes a frame at a time: let the dump finish

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def read_stacks(session: Session, ranks: list[int], sources: Mapping[int, str]) -> dict[int, str]:
    """Each rank's current Python stack (most recent call first), with the cells' lines from `sources`."""
    files = {r: session.config.run_dir / "stacks" / f"rank{r}.txt" for r in ranks}
    offsets = {r: files[r].stat().st_size if files[r].exists() else 0 for r in ranks}
    session.signal(ranks, protocol.STACK_SIGNAL)
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline and not all(
        files[r].exists() and files[r].stat().st_size > offsets[r] for r in ranks
    ):
        time.sleep(0.05)
    time.sleep(DUMP_SETTLE_S)
    stacks = {}
    for rank in ranks:
        try:
            with open(files[rank]) as fh:
                fh.seek(offsets[rank])
                stacks[rank] = format_stack(fh.read(), sources)
        except FileNotFoundError:
            continue
    return stacks


def format_stack(dump: str, sources: Mapping[int, str]) -> str:
    """A faulthandler dump, down to the innermost cell frame, each cell frame followed by its line.

    `sources` maps a cell id to its code (a cell's frames are in the file ``<cell N>``).
    """
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
