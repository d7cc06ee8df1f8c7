"""Notebook 08's calculator widget, outside a browser: the controls redraw, the button measures, and
a setup the arithmetic refuses is said, not drawn. (tests/chapters/ch08_beyond_ddp/test_browser_widget.py drives it in JupyterLab.)"""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_calculator import Setup, predict  # noqa: E402
from ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_widget import (
    calculator,
    measurable,
    plot_footprints,
    unit_for,
)


def controls(box):
    (sliders, menus), _plot, note = box.children[0].children, box.children[1], box.children[2]
    named = {c.description: c for c in (*sliders.children, *menus.children)}
    return named, note


def test_units():
    assert unit_for(10) == ("bytes", 1) and unit_for(3 * 2**20) == ("MiB", 2**20)


def test_the_button_runs_a_size_this_machine_holds():
    small = measurable(Setup(width=4096, depth=32, batch=64, world=16, strategy="zero2"), world=3)
    assert (small.width, small.depth, small.batch, small.world, small.strategy) == (128, 4, 16, 3, "zero2")


def test_static_plot_has_a_bar_per_row():
    setup = Setup(width=48, depth=2, batch=4, world=2, strategy="fsdp2")
    fig = plot_footprints([("fsdp2", predict(setup), predict(setup))])
    held_ax = fig.axes[0]
    assert [t.get_text() for t in held_ax.get_yticklabels()] == ["fsdp2, predicted", "fsdp2, measured"]


def test_a_slider_redraws_and_a_refused_setup_is_said():
    box = calculator(width=256, depth=2, world=2)
    named, note = controls(box)
    plot = box.children[1]
    before, drawn = note.value, bytes(plot.value)  # the widget holds a memoryview of the PNG
    assert drawn.startswith(b"\x89PNG")  # an image the browser shows, not output a client must route
    named["width"].value = 512
    assert note.value != before and "fullest rank holds" in note.value
    assert bytes(plot.value).startswith(b"\x89PNG") and bytes(plot.value) != drawn  # redrawn
    named["precision"].value = "bf16"  # with DDP: refused
    assert "MixedPrecisionPolicy" in note.value


def test_the_button_draws_the_measurement_and_says_where_it_differs():
    measured: list[Setup] = []

    def measure(setup):
        measured.append(setup)
        ranks = predict(setup)
        if setup.strategy == "ddp_default":
            ranks[0]["gradients"] -= 4  # a byte count the arithmetic does not expect
        return ranks

    box = calculator(measure=measure, measure_world=2, width=4096, strategy="zero1")
    named, note = controls(box)
    named["measure on live ranks"].click()
    assert measured[-1].width == 128 and measured[-1].world == 2
    assert "every byte as predicted" in note.value
    named["strategy"].value = "ddp_default"
    named["measure on live ranks"].click()
    assert "Measured otherwise: rank 0 gradients" in note.value


def test_a_7b_model_is_shown_as_asked_and_a_size_beyond_the_sliders_is_refused():
    # it showed depth 64 and 17.2 GB (a 1.07B model) for depth=417, with no warning
    box = calculator(width=4096, depth=417, world=8)
    named, note = controls(box)
    assert (named["width"].value, named["depth"].value, named["ranks"].value) == (4096, 417, 8)
    params = 4096 * 4096 * 417
    assert params > 6.9e9
    for asked in ({"depth": 5000}, {"world": 128 * 64}, {"width": 4100}):
        with pytest.raises(ValueError, match="outside what the calculator's slider shows"):
            calculator(measure=None, **asked)  # the sizes alone, no measuring
    assert calculator(world=128, batch=1000)  # within the ranges now: 128 ranks, 1000 per rank
