"""Where a stuck rank waits: its Python stack, trimmed to the cell's own frames.

A live rank registers for stack dumps as every worker does (`stack_dumps.register`, through
`setup_distributed`): a real-time signal makes faulthandler write each thread's stack to the run's
``logs/stacks/<host>-<pid>.txt``, from the signal handler itself, so a rank blocked inside a collective
(in C++, where no Python code runs) still answers. This module only formats the main thread's frames
with the cells' lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .. import stack_dumps
from .session import Session

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
        paused = any(re.search(r"[/\\](bdb|pdb)\.py\b", line) for line in lines[: in_cell[0]])
        if paused:  # pdb's own frames say nothing: where it stopped in the cell does
            lines = lines[in_cell[0] :]
        state = "paused in pdb" if paused else "running"
        parts.append(f"rank {rank}, {state} (most recent call first):\n" + "\n".join(lines))
    return "\n\n".join(parts) or "no rank answered"


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
