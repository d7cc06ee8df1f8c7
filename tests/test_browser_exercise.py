"""An exercise in JupyterLab, in Chromium: a wrong answer gets its diagnosis under the cell; the learner
types the right one into the same cell, runs it, and it passes.

Run with `make test-browser` (Chromium from apt, Playwright from pip). The browser, the page and the
page helpers are tests/test_browser.py's; this module serves a notebook of its own.
"""

from __future__ import annotations

import time

import pytest
from conftest import assert_no_processes_left
from lab_server import serving_cells
from test_browser import (
    SCREENSHOTS,
    TOKEN,
    cells,
    open_notebook,
    page,
    playwright_api,
    run_all_cells,
    wait_finished,
)

from ddp_helpers.rank.registry import get

pytestmark = pytest.mark.browser
__all__ = ["page", "playwright_api"]  # the fixtures, imported so that pytest finds them here

REFERENCE = get("01-shard").reference
WRONG = REFERENCE.replace(
    "    sampler.set_epoch(epoch)  # shuffles with seed + epoch: a new order each epoch\n", ""
)
CELLS = [
    "%load_ext ddp_helpers\n%ranks start --nproc 2 --backend gloo --timeout 120 --run-dir {run_dir}",
    "%%exercise 01-shard\n" + WRONG,
]  # the ranks stay up for the second try; they exit with the kernel when the lab stops


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab, as tests/test_browser.py starts it, serving one notebook with one exercise cell."""
    root = tmp_path_factory.mktemp("browser-exercise")
    run_dir = root / "notebooks" / "runs" / "exercise-ranks"
    cells = [source.format(run_dir=run_dir) if "{run_dir}" in source else source for source in CELLS]
    with serving_cells(root, "exercise.ipynb", cells, TOKEN) as served:
        yield served
    assert_no_processes_left(str(run_dir), wait_s=5)


def _output_of(page, index: int, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = cells(page)
        if text in state[index]["output"] and state[index]["prompt"].strip() != "[*]:":
            return state[index]["output"]
        time.sleep(0.3)
    page.screenshot(path=str(SCREENSHOTS / "exercise-failed.png"))
    pytest.fail(f"cell {index} never showed {text!r}: {cells(page)[index]['output'][-1500:]}")


def test_a_wrong_answer_is_named_then_the_right_one_passes(page, lab):
    base, _ = lab
    open_notebook(page, base, "exercise.ipynb")
    run_all_cells(page)
    state = wait_finished(page, timeout_s=300)
    assert not any(c["errors"] for c in state), [c["output"][-800:] for c in state if c["errors"]]
    wrong = state[1]["output"]
    assert "01-shard: 01-shard-no-set-epoch" in wrong and "set_epoch" in wrong, wrong
    assert "hint:" in wrong and REFERENCE.splitlines()[3].strip() not in wrong, (
        "the fix shows before it is asked"
    )
    exercise = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(1)
    exercise.scroll_into_view_if_needed()
    exercise.screenshot(path=str(SCREENSHOTS / "exercise-wrong.png"))
    # the learner's fix: select the cell's text, type the right answer, Shift+Enter
    ranks_started = cells(page)[0]["output"]
    assert "live rank(s)" in ranks_started, ranks_started
    exercise.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text("%%exercise 01-shard\n" + REFERENCE)
    page.keyboard.press("Shift+Enter")
    right = _output_of(page, 1, "passed", timeout_s=120)
    assert "01-shard-no-set-epoch" not in right and "starting them" not in right, right  # the same ranks
    exercise.screenshot(path=str(SCREENSHOTS / "exercise-passed.png"))
