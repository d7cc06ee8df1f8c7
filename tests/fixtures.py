"""What several test modules share, imported by those that use it (conftest holds what every test gets).

- `module_live_ranks(nproc)`: a module's `ranks` fixture, live ranks its tests share;
- `load_script(name, path)`: a script that is no package's module (mutants/run.py, a benchmark), imported.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from conftest import assert_no_processes_left

import ddp_helpers
from ddp_helpers.kernel.live.ranks import LiveRanks


def module_live_ranks(nproc: int):  # -> pytest's fixture definition (its type is private to pytest)
    """A module-scoped fixture: `nproc` live gloo ranks that the module's tests share (starting ranks costs
    seconds). After the module's last test they stop, and no process of theirs is left.

        ranks = module_live_ranks(nproc=2)  # in a test module: its tests take `ranks`
    """

    @pytest.fixture(scope="module")
    def ranks(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[LiveRanks]:
        # its own run folder: a module's fixture starts before conftest sets DDP_HELPERS_RUNS_DIR for a test
        run_dir = tmp_path_factory.mktemp(f"ranks-{request.module.__name__}")
        live = ddp_helpers.start_ranks(nproc=nproc, backend="gloo", run_dir=run_dir, timeout=60)
        yield live
        live.shutdown()
        assert_no_processes_left(str(run_dir))

    return ranks


def load_script(name: str, path: Path) -> ModuleType:
    """`path` imported as module `name` (and registered so: dataclasses look their module up by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"{path} cannot be imported"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
