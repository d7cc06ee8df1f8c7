"""Notebook 08's calculator widget in JupyterLab, in Chromium: a slider moved by the keyboard redraws
the plot. Run with `make test-browser` (or `pytest -m browser tests/chapters/ch08_beyond_ddp/test_browser_widget.py`).

The JupyterLab server and the page helpers are tests/test_browser.py's and tests/lab_server.py's; this
module serves one small notebook of its own, so that no training job runs before the widget is seen.
"""

from __future__ import annotations

import time

import pytest
from lab_server import serving_cells
from test_browser import (  # noqa: F401 (page and playwright_api are fixtures)
    SCREENSHOTS,
    TOKEN,
    cell_with,
    cells,
    open_notebook,
    page,
    playwright_api,
    run_all_cells,
    shoot,
    wait_finished,
)

pytestmark = pytest.mark.browser

NOTEBOOK = "calculator.ipynb"
IMAGE_JS = """() => { const img = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) img.widget-image');
                      return img ? img.getAttribute('src') : null; }"""


@pytest.fixture(scope="module")
def widget_lab(tmp_path_factory):
    """JupyterLab (scripts/lab.sh) serving one notebook that shows the calculator."""
    cell = (
        "from ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_widget import calculator\n\n"
        "calculator(width=1024, depth=8, world=4, strategy='fsdp2')"
    )
    with serving_cells(tmp_path_factory.mktemp("browser-widget"), NOTEBOOK, [cell], TOKEN) as (base, _served):
        yield base


def wait_for_image(page, not_this: str | None, timeout_s: float) -> str:  # noqa: F811
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        src = page.evaluate(IMAGE_JS)
        if src and src != not_this:
            return src
        time.sleep(0.2)
    page.screenshot(path=str(SCREENSHOTS / "failed-calculator.png"), full_page=True)
    pytest.fail("the calculator's plot did not " + ("change" if not_this else "appear"))


def test_moving_a_slider_redraws_the_calculators_plot(page, widget_lab):  # noqa: F811
    open_notebook(page, widget_lab, NOTEBOOK)
    run_all_cells(page)
    state = wait_finished(page, timeout_s=60)
    assert not any(c["errors"] for c in state), [c["output"][-500:] for c in state if c["errors"]]
    first = wait_for_image(page, None, timeout_s=30)
    note = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .widget-html").last
    before = note.text_content()
    width = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .widget-slider").first
    assert "width" in width.text_content()
    handle = width.locator(".noUi-handle").first
    handle.focus()
    for _ in range(8):
        handle.press("ArrowRight")  # one step each: 16 wider
    second = wait_for_image(page, first, timeout_s=30)
    assert second != first
    settled = None  # each key press redraws: wait for the last redraw before the screenshot
    while settled != (settled := page.evaluate(IMAGE_JS)):
        time.sleep(1.0)
    assert note.text_content() != before  # the note was recomputed too
    shoot(page, cell_with(cells(page), "calculator("), "08-calculator-widget.png")
