"""Notebook 08's calculator as a widget: sliders and menus, a plot that redraws, and a button that
measures the chosen configuration on live ranks and draws the measured bars beside the predicted ones.

    calculator(measure=measure_on_live_ranks, measure_world=2)   # in JupyterLab
    plot_footprints([("ddp", predicted, measured), ...])          # the same plot, static (papermill)

The arithmetic is `memory_calculator`'s; this module only draws and wires.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_calculator import (
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


def plot_footprints(entries: Sequence[Entry], title: str = "") -> Figure:
    """Stacked bars of the fullest rank's bytes, predicted and (where given) measured, and the bytes
    one rank sends per step on a ring (each entry's world: its number of ranks). Returns the figure."""
    rows = []
    for label, predicted, measured in entries:
        rows.append((f"{label}, predicted", fullest(predicted), len(predicted)))
        if measured is not None:
            rows.append((f"{label}, measured", fullest(measured), len(measured)))
    held_unit, held_size = unit_for(max(sum(r[p] for p in PARTS) for _, r, _ in rows))
    sent = [ring_bytes_per_rank(r["sent"], world) for _, r, world in rows]
    sent_unit, sent_size = unit_for(max(sent))
    fig, (held_ax, sent_ax) = plt.subplots(1, 2, figsize=(10, 0.45 * len(rows) + 1.8), sharey=True)
    labels = [label for label, _, _ in rows]
    left = [0.0] * len(rows)
    for part in PARTS:
        values = [r[part] / held_size for _, r, _ in rows]
        held_ax.barh(labels, values, left=left, color=COLOURS[part], label=part)
        left = [a + b for a, b in zip(left, values, strict=True)]
    held_ax.invert_yaxis()
    held_ax.set_xlabel(f"{held_unit} held by the fullest rank at the end of forward")
    fig.legend(*held_ax.get_legend_handles_labels(), loc="lower center", ncol=len(PARTS), fontsize="small")
    sent_ax.barh(labels, [s / sent_size for s in sent], color="tab:gray")
    sent_ax.set_xlabel(f"{sent_unit} one rank sends per step (ring)")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 1))  # the legend below the bars
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


# each slider's range: a slider silently clamps a value beyond it, so `calculator` refuses one instead.
# Wide enough for a 70B model of this shape (one width x width Linear per block: width 8192, depth 1043)
SLIDERS = {"width": (16, 16384, 16), "depth": (1, 2048, 1), "batch": (1, 4096, 1), "world": (1, 4096, 1)}
LABELS = {"width": "width", "depth": "depth", "batch": "batch/rank", "world": "ranks"}


def check_ranges(setup: Setup) -> None:
    """Refuse a size the sliders cannot show, rather than show another one."""
    for name, (low, high, step) in SLIDERS.items():
        value = getattr(setup, name)
        if not low <= value <= high or (value - low) % step:
            raise ValueError(
                f"{name}={value} is outside what the calculator's slider shows ({low} to {high}"
                + (f", in steps of {step}" if step > 1 else "")
                + "): call memory_calculator.predict(Setup(...)) for any size"
            )


def controls_for(w: Any, first: Setup) -> dict[str, Any]:
    """The calculator's inputs, one per field of `Setup`, set to `first` (checked by `check_ranges`)."""
    check_ranges(first)
    sliders = {
        name: w.IntSlider(value=getattr(first, name), min=low, max=high, step=step, description=LABELS[name])
        for name, (low, high, step) in SLIDERS.items()
    }
    return {
        **sliders,
        "strategy": w.Dropdown(options=STRATEGIES, value=first.strategy, description="strategy"),
        "precision": w.Dropdown(options=PRECISIONS, value=first.precision, description="precision"),
        "recompute": w.Checkbox(value=first.recompute, description="activation checkpointing"),
    }


def draw(
    plot: Any, note: Any, setup: Setup, small: Setup | None = None, measured: list[dict] | None = None
) -> None:
    """Redraw the widget's plot (`plot`, an Image: its PNG) and its note (`note`, an HTML) for `setup`,
    and for `small` with what was `measured` there.

    An Image, not an Output widget that a figure is displayed into: papermill's client (nbclient 0.11)
    answers an Output widget's output with a message on the kernel's shell channel while it waits there
    for the cell's reply, and then may not see the reply until its timeout (nbclient issue #312): in a
    fresh-clone `.ci/run` here, notebook 08's widget cell once took exactly the tests' 600 s timeout."""
    entries: list[Entry] = [(f"{setup.strategy}, as set", predict(setup), None)]
    if small is not None:
        entries.append((f"{setup.strategy}, at the measured size", predict(small), measured))
    figure = plot_footprints(entries, f"{setup.strategy}, {setup.precision}")
    png = io.BytesIO()
    figure.savefig(png, format="png", bbox_inches="tight")  # as Jupyter's inline backend draws it
    plt.close(figure)
    plot.value = png.getvalue()
    shown = small or setup
    note.value = f"<p>{explain(shown, predict(shown), measured)}</p>"


def calculator(measure: Measure | None = None, measure_world: int = 2, **start: Any) -> Any:
    """The widget: sliders (width, depth, batch, world), menus (strategy, precision), recomputation,
    a plot that redraws on every change and, with `measure`, a button that runs the configuration on
    live ranks and draws the measured bars beside the predicted ones. Returns the widget (a cell shows it)."""
    import ipywidgets as w  # type: ignore[import-untyped]  # ships no type information

    controls = controls_for(w, Setup(**{"width": 1024, "depth": 8, "batch": 8, "world": 4, **start}))
    button = w.Button(
        description="measure on live ranks", disabled=measure is None, layout=w.Layout(width="220px")
    )
    plot, note = w.Image(format="png"), w.HTML()

    def current() -> Setup | None:
        try:
            return Setup(**{name: c.value for name, c in controls.items()})
        except ValueError as error:  # e.g. bf16 with DDP: say so instead of drawing
            note.value = f"<p><b>{error}</b></p>"
            return None

    def redraw(_change: object = None) -> None:
        setup = current()
        if setup is not None:
            draw(plot, note, setup)

    def run(_button: object) -> None:
        setup = current()
        if setup is not None and measure is not None:
            small = measurable(setup, measure_world)
            draw(plot, note, setup, small, measure(small))

    for control in controls.values():
        control.observe(redraw, names="value")
    button.on_click(run)
    redraw()
    inputs = list(controls.values())
    return w.VBox([w.HBox([w.VBox(inputs[:4]), w.VBox([*inputs[4:], button])]), plot, note])
