"""What a learner sees in JupyterLab, in a real browser: Debian's Chromium driven by Playwright.

Papermill proves the cells run; this proves the live `[rank N]` log renders while a cell runs, the
progress widget finishes, the tables and plots render, and an interrupted cell stops cleanly.
Run with `make test-browser`, which installs Chromium (apt) and Playwright (pip) first.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import nbformat
import pytest
from conftest import assert_no_processes_left
from lab_server import REPO, start, stop, wait_for_contents

from ddp_helpers.kernel.launcher.machine import free_port

pytestmark = pytest.mark.browser

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = REPO / "runs" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
TOKEN = "browser-test-token"


def _missing(reason: str) -> None:
    # CI sets REQUIRE_BROWSER=1: there, a missing browser is a failure, never a silent skip.
    if os.environ.get("REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}; REQUIRE_BROWSER=1, so this is an error, not a skip")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def playwright_api():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed: run `make test-browser`, which pip-installs it")
    if not CHROMIUM.is_file():
        _missing(f"no Chromium at {CHROMIUM}: `make test-browser` installs it with apt (as root)")
    with sync_playwright() as api:
        yield api


def _smoke_copy(source: Path, target: Path) -> None:
    """The notebook with `smoke = True`, as papermill would inject it; the repository's copy stays clean."""
    nb = nbformat.read(source, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert "smoke = False" in params.source
    params.source = params.source.replace("smoke = False", "smoke = True", 1)
    nbformat.write(nb, target)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab started by scripts/lab.sh on a free port, serving smoke copies of the notebooks."""
    root = tmp_path_factory.mktemp("browser")
    served = root / "notebooks"
    served.mkdir()
    for name in ("00_environment_check.ipynb", "02_single_vs_dataparallel_vs_ddp.ipynb"):
        _smoke_copy(REPO / "notebooks" / name, served / name)
    interrupt = nbformat.v4.new_notebook()
    interrupt.cells = [
        nbformat.v4.new_code_cell(
            "import ddp_helpers\n"
            'worker = ddp_helpers.write_worker("train", "runs/workers", show=False)\n'
            'ddp_helpers.launch(worker, "--model", "mlp", "--steps", 100000, "--log-every", 50, nproc=2)'
        )
    ]
    interrupt.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(interrupt, served / "interrupt.ipynb")
    # Every cell stays in the page (no virtual scrolling), and no news or update pop-ups.
    settings = root / "settings"
    for plugin, values in {
        "notebook-extension/tracker": {"windowingMode": "none", "autoStartDefaultKernel": True},
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }.items():
        path = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port = free_port()
    env = {
        "NOTEBOOK_DIR": str(served),
        "JUPYTER_TOKEN": TOKEN,
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces"),
        "DDP_HELPERS_RUNS_DIR": str(served / "runs"),
        "DDP_HELPERS_PROGRESS": "",  # unset: the kernel picks the widget itself, as in a real lab
    }
    lab = start(REPO / "scripts" / "lab.sh", root, port, log=root / "lab.log", **env)
    try:
        wait_for_contents(lab, port, TOKEN)
        yield f"http://127.0.0.1:{port}", served
    finally:
        stop(lab)


@pytest.fixture(scope="module")
def page(playwright_api, tmp_path_factory):
    """One Chromium page for the module. Tests ask for it before `lab`, so that a missing browser
    skips (or fails) before JupyterLab is started."""
    context = playwright_api.chromium.launch_persistent_context(
        str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh user-data dir
        executable_path=str(CHROMIUM),
        headless=True,
        args=CHROMIUM_ARGS,
        viewport={"width": 1400, "height": 1000},
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield context.new_page()
    finally:
        context.close()


# ------------------------------------------------------------------------------------- page helpers

CELLS_JS = """() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell'))
  .map(cell => ({
    prompt: (cell.querySelector('.jp-InputPrompt') || {}).textContent || '',
    source: (cell.querySelector('.cm-content') || {}).textContent || '',
    output: (cell.querySelector('.jp-OutputArea') || {}).textContent || '',
    images: cell.querySelectorAll('.jp-OutputArea img').length,
    tables: cell.querySelectorAll('.jp-OutputArea table').length,
    errors: cell.querySelectorAll('[data-mime-type="application/vnd.jupyter.error"]').length,
    progress: cell.querySelectorAll('.jp-OutputArea .widget-hprogress').length,
  }))"""


KERNEL_READY_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel || document.querySelector('.jp-Dialog')) return false;
  const status = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  const kernel = panel.querySelector('.jp-KernelName');
  return !!status && status.getAttribute('data-status') === 'idle' && !!kernel && !/No Kernel/.test(kernel.textContent);
}"""


def cells(page) -> list[dict]:
    return page.evaluate(CELLS_JS)


def open_notebook(page, base: str, name: str) -> None:
    """Open `name` and wait until its kernel is up and idle, accepting the kernel dialog if one shows."""
    # a workspace of its own, so that only this notebook is open
    page.goto(f"{base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={TOKEN}")
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell", timeout=60_000)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        accept = page.locator(".jp-Dialog .jp-mod-accept")
        if accept.count():
            accept.first.click()  # "Select Kernel": the notebook's own python3
        elif page.evaluate(KERNEL_READY_JS):
            return
        time.sleep(0.5)
    page.screenshot(path=str(SCREENSHOTS / "failed.png"))
    pytest.fail(f"the kernel of {name} did not become ready")


def run_all_cells(page) -> None:
    """Run > Run All Cells, through the menu bar, as a learner would; again if the first click was
    taken before the notebook had focus."""
    for _ in range(3):
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputPrompt").first.click()
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(c["prompt"].strip() != "[ ]:" for c in cells(page)):
                return
            time.sleep(0.2)
    pytest.fail("Run All Cells started nothing")


def wait_finished(page, timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = cells(page)
        if state and all(c["prompt"].strip() not in ("[*]:", "[ ]:") for c in state):
            return state
        if any(c["errors"] for c in state) and not any("[*]" in c["prompt"] for c in state):
            return state
        time.sleep(0.5)
    page.screenshot(path=str(SCREENSHOTS / "failed.png"))
    pytest.fail(f"cells still running after {timeout_s:g}s: {[c['prompt'] for c in cells(page)]}")


def cell_with(state: list[dict], text: str) -> int:
    return next(i for i, c in enumerate(state) if text in c["source"])


def shoot(page, index: int, name: str) -> None:
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(index)
    cell.scroll_into_view_if_needed()
    cell.screenshot(path=str(SCREENSHOTS / name))


# ------------------------------------------------------------------------------------------- tests


def test_environment_check_renders_its_table_and_plot(page, lab):
    base, _ = lab
    open_notebook(page, base, "00_environment_check.ipynb")
    run_all_cells(page)
    # the lesson starts live ranks and checks two exercises besides its torchrun job: 30-45 s under papermill
    state = wait_finished(page, timeout_s=120)
    assert not any(c["errors"] for c in state), [c["output"][-500:] for c in state if c["errors"]]
    checks = state[cell_with(state, "doctor.checks_frame(checks)")]
    assert checks["tables"] == 1 and "PASS" in checks["output"]
    plot = cell_with(state, "plots.allreduce_bandwidth(")
    assert state[plot]["images"] >= 1
    page.screenshot(path=str(SCREENSHOTS / "00-environment-check.png"))
    shoot(page, plot, "00-bandwidth-plot.png")


def test_ddp_cell_streams_rank_lines_before_it_finishes(page, lab):
    base, _ = lab
    open_notebook(page, base, "02_single_vs_dataparallel_vs_ddp.ipynb")
    run_all_cells(page)
    ddp = cell_with(cells(page), 'runs["ddp"] = launch(')
    live = False
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        cell = cells(page)[ddp]
        running = cell["prompt"].strip() == "[*]:"
        if running and "[rank 0]" in cell["output"] and "[rank 1]" in cell["output"]:
            live = True  # both ranks' lines are on screen while the cell is still executing
            shoot(page, ddp, "01-live-log.png")
            break
        if cell["prompt"].strip() not in ("[*]:", "[ ]:", "[]:"):
            break  # finished without our seeing it live
        time.sleep(0.1)
    if not live:
        page.screenshot(path=str(SCREENSHOTS / "failed.png"), full_page=True)
        state = cells(page)
        failed = [c["output"][-800:] for c in state if c["errors"]]
        pytest.fail(
            f"no live [rank 0] and [rank 1] lines while the DDP cell ran: {state[ddp]}; errors: {failed}"
        )
    state = wait_finished(page, timeout_s=180)
    assert not any(c["errors"] for c in state), [c["output"][-500:] for c in state if c["errors"]]
    cell = state[ddp]
    assert cell["progress"] >= 1, "no progress widget in the DDP cell"
    assert "100%" in cell["output"], cell["output"][-300:]
    throughput = cell_with(state, "plots.throughput_by_mode(")
    assert state[throughput]["images"] >= 1
    shoot(page, throughput, "01-throughput.png")


def test_interrupt_button_stops_the_run_cleanly(page, lab):
    base, served = lab
    open_notebook(page, base, "interrupt.ipynb")
    run_all_cells(page)
    page.wait_for_function(
        """() => { const out = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea');
                   return out && out.textContent.includes('[rank 1]'); }""",
        timeout=90_000,
    )
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) [data-command='notebook:interrupt-kernel']").click()
    state = wait_finished(page, timeout_s=60)
    output = state[0]["output"]
    assert "interrupted: every process of the run was stopped" in output
    assert "Traceback" not in output and "---------" not in output, output[-800:]
    page.screenshot(path=str(SCREENSHOTS / "interrupt.png"))
    assert_no_processes_left(str(served / "runs" / "workers"), wait_s=5)
