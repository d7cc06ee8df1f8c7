"""The cells sent to live ranks: each request's id and code, kept for the life of a `LiveRanks`.

`calls` numbers each request here and `recovery` reads it back: a stuck rank's stack names its cell
by id, and the cell's code shows the line it waits on.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CellLog:
    """Every request's id and code, for the life of a `LiveRanks` (ids go on across restarts).

    A stuck rank's stack names its cell by id (``<cell 3>``); the code shows the line it waits on.
    """

    sources: dict[int, str] = field(default_factory=dict)
    last_id: int = 0  # the id given last
    last_sent: int = 0  # the id of the last request sent

    def new(self, code: str) -> int:
        self.last_id += 1
        self.sources[self.last_id] = code
        return self.last_id
