"""Notebook 08's calculator as a widget: sliders and menus, a plot that redraws, and a button that
measures the chosen configuration on live ranks and draws the measured bars beside the predicted ones.

    calculator(measure=measure_on_live_ranks, measure_world=2)   # in JupyterLab
    plot_footprints([("ddp", predicted, measured), ...])        # the same plot, static (papermill)

The arithmetic is `memory_calculator`'s; this module only draws and wires.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import matplotlib.pyplot as plt

from .memory_calculator import (
    PARTS,
    PRECISIONS,
    STRATEGIES,
    WHY,
    Setup,
    disagreements,
    predict,
    ring_bytes_per_rank,
)

Measure = Callable[[Setup], list[dict]]
Entry = tuple[str, list[dict], list[dict] | None]  # (label, predicted per rank, measured per rank or None)
COLOURS = {
    "parameters": "tab:blue",
    "gradients": "tab:orange",
    "optimizer": "tab:green",
    "activations": "tab:red",
}
MEASURABLE = {"width": 128, "depth": 4, "batch": 16}  # the button's cap: a size this machine holds at once


def unit_for(largest: float) -> tuple[str, float]:
    """A readable unit for byte counts up to `largest`."""
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return name, size
    return "bytes", 1


def fullest(ranks: list[dict]) -> dict:
    """The rank that holds the most (the one that runs out of memory first)."""
    return max(ranks, key=lambda r: sum(r[p] for p in PARTS))


def plot_footprints(entries: Sequence[Entry], world: int, title: str = ""):
    """Stacked bars of the fullest rank's bytes, predicted and (where given) measured, and the bytes
    one rank sends per step on a ring. Returns the figure."""
    rows = []
    for label, predicted, measured in entries:
        rows.append((f"{label}, predicted", fullest(predicted)))
        if measured is not None:
            rows.append((f"{label}, measured", fullest(measured)))
    held_unit, held_size = unit_for(max(sum(r[p] for p in PARTS) for _, r in rows))
    sent = [ring_bytes_per_rank(r["sent"], world) for _, r in rows]
    sent_unit, sent_size = unit_for(max(sent))
    fig, (held_ax, sent_ax) = plt.subplots(1, 2, figsize=(10, 0.45 * len(rows) + 1.4), sharey=True)
    labels = [label for label, _ in rows]
    left = [0.0] * len(rows)
    for part in PARTS:
        values = [r[part] / held_size for _, r in rows]
        held_ax.barh(labels, values, left=left, color=COLOURS[part], label=part)
        left = [a + b for a, b in zip(left, values, strict=True)]
    held_ax.invert_yaxis()
    held_ax.set_xlabel(f"{held_unit} held by the fullest rank at the end of forward")
    held_ax.legend(fontsize="small", loc="lower right")
    sent_ax.barh(labels, [s / sent_size for s in sent], color="tab:gray")
    sent_ax.set_xlabel(f"{sent_unit} one rank sends per step (ring)")
    fig.suptitle(title or f"{world} rank(s)")
    fig.tight_layout()
    return fig


def explain(setup: Setup, predicted: list[dict], measured: list[dict] | None) -> str:
    """What the bars mean, and where the measurement differs from the arithmetic."""
    top = fullest(predicted)
    held = sum(top[p] for p in PARTS)
    text = f"{WHY[setup.strategy]}. The fullest rank holds {held:,} bytes ({top['parameters']:,} of them weights)."
    if measured is None:
        return text
    lines = disagreements(predicted, measured)
    if not lines:
        return text + (
            f" Measured on {setup.world} live rank(s) at width {setup.width}, depth {setup.depth}, "
            f"batch {setup.batch}: every byte as predicted."
        )
    return text + " Measured otherwise: " + "; ".join(lines)


def measurable(setup: Setup, world: int) -> Setup:
    """`setup` shrunk to what the button runs: at most MEASURABLE's sizes, on the live ranks' world."""
    smaller = {name: min(getattr(setup, name), cap) for name, cap in MEASURABLE.items()}
    return dataclasses.replace(setup, world=world, **smaller)


def calculator(measure: Measure | None = None, measure_world: int = 2, **start):
    """The widget: sliders (width, depth, batch, world), menus (strategy, precision), recomputation,
    a plot that redraws on every change and, with `measure`, a button that runs the configuration on
    live ranks and draws the measured bars beside the predicted ones."""
    import ipywidgets as w
    from IPython.display import display

    first = Setup(**{"width": 1024, "depth": 8, "batch": 8, "world": 4, **start})
    controls = {
        "width": w.IntSlider(value=first.width, min=16, max=8192, step=16, description="width"),
        "depth": w.IntSlider(value=first.depth, min=1, max=64, description="depth"),
        "batch": w.IntSlider(value=first.batch, min=1, max=256, description="batch/rank"),
        "world": w.IntSlider(value=first.world, min=1, max=64, description="ranks"),
        "strategy": w.Dropdown(options=STRATEGIES, value=first.strategy, description="strategy"),
        "precision": w.Dropdown(options=PRECISIONS, value=first.precision, description="precision"),
        "recompute": w.Checkbox(value=first.recompute, description="activation checkpointing"),
    }
    button = w.Button(description="measure on live ranks", disabled=measure is None)
    plot, note = w.Output(), w.HTML()

    def draw(setup: Setup, measured_setup: Setup | None = None, measured: list[dict] | None = None) -> None:
        entries: list[Entry] = [(f"{setup.strategy}, as set", predict(setup), None)]
        if measured_setup is not None:
            entries.append((f"{setup.strategy}, at the measured size", predict(measured_setup), measured))
        plot.clear_output(wait=True)
        with plot:
            display(plot_footprints(entries, setup.world, f"{setup.strategy}, {setup.precision}"))
            plt.close("all")
        shown = measured_setup or setup
        note.value = f"<p>{explain(shown, predict(shown), measured)}</p>"

    def current() -> Setup | None:
        try:
            return Setup(**{name: c.value for name, c in controls.items()})
        except ValueError as error:  # e.g. bf16 with DDP: say so instead of drawing
            note.value = f"<p><b>{error}</b></p>"
            return None

    def redraw(_change=None) -> None:
        setup = current()
        if setup is not None:
            draw(setup)

    def run(_button) -> None:
        setup = current()
        if setup is not None and measure is not None:
            small = measurable(setup, measure_world)
            draw(setup, small, measure(small))

    for control in controls.values():
        control.observe(redraw, names="value")
    button.on_click(run)
    redraw()
    box = w.VBox(
        [
            w.HBox([w.VBox(list(controls.values())[:4]), w.VBox([*list(controls.values())[4:], button])]),
            plot,
            note,
        ]
    )
    display(box)
    return box
