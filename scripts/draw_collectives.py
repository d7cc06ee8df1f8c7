"""Draw each collective on 4 ranks, before and after, as the SVG files docs/glossary.md shows.

    .venv/bin/python scripts/draw_collectives.py            # writes docs/images/collective-*.svg
    .venv/bin/python scripts/draw_collectives.py --out DIR  # somewhere else (the test uses a temp folder)

Rank r's buffer starts as four chunks named by its letter (rank 0: a0 a1 a2 a3, rank 1: b0 ..., and so
on), coloured by the rank they came from. A chunk that is a sum over the ranks is "Σj" (aj + bj + cj + dj)
and drawn in grey. The output is deterministic (no date, a fixed hash salt), so a rerun with the same
matplotlib changes no committed file.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

RANKS = 4
LETTERS = "abcd"
RANK_COLOURS = ("#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc")  # one light colour per rank
SUM_COLOUR = "#d9d9d9"
UNKNOWN = "?"  # a buffer whose content torch does not define
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "images"

# a cell: its label, or None where the buffer has no chunk at that position
Row = list[str | None]


@dataclass(frozen=True)
class Collective:
    name: str  # the file is collective-<name>.svg
    title: str
    call: str  # the torch.distributed call that does it
    before: list[Row]  # one row per rank
    after: list[Row]
    note: str


def _own(rank: int) -> Row:
    return [f"{LETTERS[rank]}{j}" for j in range(RANKS)]


def _sums() -> Row:
    return [f"Σ{j}" for j in range(RANKS)]


def _only(rank: int, label: str) -> Row:
    return [label if j == rank else None for j in range(RANKS)]


COLLECTIVES = (
    Collective(
        "all-reduce",
        "all-reduce",
        "dist.all_reduce(t)",
        [_own(r) for r in range(RANKS)],
        [_sums() for _ in range(RANKS)],
        "every rank ends with the sum of every rank's buffer (Σj = aj + bj + cj + dj)",
    ),
    Collective(
        "reduce-scatter",
        "reduce-scatter",
        "dist.reduce_scatter_tensor(out, t)",
        [_own(r) for r in range(RANKS)],
        [_only(r, f"Σ{r}") for r in range(RANKS)],
        "rank r ends with chunk r of the sum: an output a quarter of the input's size",
    ),
    Collective(
        "all-gather",
        "all-gather",
        "dist.all_gather_into_tensor(out, t)",
        [_only(r, LETTERS[r]) for r in range(RANKS)],
        [list(LETTERS) for _ in range(RANKS)],
        "every rank ends with every rank's chunk, in rank order: no arithmetic, only copies",
    ),
    Collective(
        "broadcast",
        "broadcast (src=0)",
        "dist.broadcast(t, src=0)",
        [_own(0)] + [[UNKNOWN] * RANKS for _ in range(1, RANKS)],
        [_own(0) for _ in range(RANKS)],
        "every rank ends with rank 0's buffer; what the others held is overwritten",
    ),
    Collective(
        "reduce",
        "reduce (dst=0)",
        "dist.reduce(t, dst=0)",
        [_own(r) for r in range(RANKS)],
        [_sums()] + [[UNKNOWN] * RANKS for _ in range(1, RANKS)],
        "only rank 0 is promised the sum; torch's docs define no result on the other ranks",
    ),
)


def _colour(label: str) -> str:
    if label == UNKNOWN:
        return "white"
    if label.startswith("Σ"):
        return SUM_COLOUR
    return RANK_COLOURS[LETTERS.index(label[0])]


def _draw_buffers(ax: Axes, rows: list[Row], heading: str) -> None:
    ax.set_xlim(-1.4, RANKS + 0.1)
    ax.set_ylim(RANKS + 0.1, -0.9)
    ax.axis("off")
    ax.text(RANKS / 2 - 0.5 + 0.5, -0.55, heading, ha="center", va="center", fontsize=11, weight="bold")
    for rank, row in enumerate(rows):
        ax.text(-0.15, rank + 0.5, f"rank {rank}", ha="right", va="center", fontsize=10)
        for position, label in enumerate(row):
            if label is None:
                continue
            ax.add_patch(
                Rectangle(
                    (position + 0.05, rank + 0.08),
                    0.9,
                    0.84,
                    facecolor=_colour(label),
                    edgecolor="#555555",
                    linestyle=":" if label == UNKNOWN else "-",
                )
            )
            ax.text(position + 0.5, rank + 0.5, label, ha="center", va="center", fontsize=10)


def draw(collective: Collective, out_dir: Path) -> Path:
    fig = Figure(figsize=(8.4, 3.1))  # no pyplot: no backend or global state to leave behind
    before = fig.add_axes((0.0, 0.11, 0.42, 0.7))
    after = fig.add_axes((0.56, 0.11, 0.42, 0.7))
    _draw_buffers(before, collective.before, "before")
    _draw_buffers(after, collective.after, "after")
    fig.patches.append(
        FancyArrowPatch(
            (0.44, 0.43),
            (0.54, 0.43),
            transform=fig.transFigure,
            arrowstyle="-|>",
            mutation_scale=18,
            color="#333333",
        )
    )
    fig.text(0.5, 0.97, collective.title, ha="center", va="top", fontsize=13, weight="bold")
    fig.text(0.5, 0.86, collective.call, ha="center", va="top", fontsize=9, family="monospace")
    fig.text(0.5, 0.03, collective.note, ha="center", va="bottom", fontsize=9, style="italic")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"collective-{collective.name}.svg"
    fig.savefig(path, format="svg", metadata={"Date": None})
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the SVG files")
    args = parser.parse_args(argv)
    # text stays text (smaller files a reader can search), and ids do not change from run to run
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "ddp-workbench-collectives"}):
        paths = [draw(collective, args.out) for collective in COLLECTIVES]
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
