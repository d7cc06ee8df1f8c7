"""pdb on a live rank in JupyterLab, in Chromium: the prompt is Jupyter's input box, answered by typing.

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

pytestmark = pytest.mark.browser
__all__ = ["page", "playwright_api"]  # the fixtures, imported so that pytest finds them here

STDIN = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Stdin-input"
CELLS = [
    "%load_ext ddp_helpers\n%ranks start --nproc 2 --backend gloo --timeout 120 --run-dir {run_dir}",
    "%%ranks\nx = torch.ones(1) * (rank + 1)\nsecret = rank * 10 + 7\nif rank == 1:\n    breakpoint()\n"
    "dist.all_reduce(x)\nx.item()",
    "%ranks stop",
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab, as tests/test_browser.py starts it, serving one notebook that stops rank 1 in pdb."""
    root = tmp_path_factory.mktemp("browser-pdb")
    run_dir = root / "notebooks" / "runs" / "pdb-ranks"
    with serving_cells(
        root, "pdb.ipynb", [source.format(run_dir=run_dir) for source in CELLS], TOKEN
    ) as served:
        yield served
    assert_no_processes_left(str(run_dir), wait_s=5)


def answer_prompt(page, expected_prompt: str, command: str, timeout_s: float = 180) -> str:
    """Wait for Jupyter's input box, check its prompt, type `command` and Enter; the prompt's text."""
    box = page.locator(STDIN).last
    box.wait_for(state="visible", timeout=timeout_s * 1000)
    prompt = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Stdin-prompt").last.text_content() or ""
    assert prompt.strip() == expected_prompt.strip(), prompt
    box.fill(command)
    box.press("Enter")
    return prompt


def test_a_pdb_prompt_on_rank_1_is_answered_in_jupyterlab(page, lab):
    base, _ = lab
    open_notebook(page, base, "pdb.ipynb")
    run_all_cells(page)
    page.locator(STDIN).last.wait_for(state="visible", timeout=240_000)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(1).scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "pdb-prompt.png"))
    answer_prompt(page, "rank 1 (Pdb) ", "p secret")
    deadline = time.monotonic() + 60  # the answer shows, and pdb asks again
    while time.monotonic() < deadline and "17" not in cells(page)[1]["output"]:
        time.sleep(0.2)
    answer_prompt(page, "rank 1 (Pdb) ", "c")
    state = wait_finished(page, timeout_s=120)
    assert not any(c["errors"] for c in state), [c["output"][-800:] for c in state if c["errors"]]
    output = state[1]["output"]
    assert "-> dist.all_reduce(x)" in output and "17" in output, output
    assert "[rank 0] Out: 3.0" in output and "[rank 1] Out: 3.0" in output, output
    assert "every rank has exited" in state[2]["output"], state[2]["output"]
    page.screenshot(path=str(SCREENSHOTS / "pdb-answered.png"))
