"""A type checker sees launch()'s options: a mistyped keyword is an error before anything runs.

`make lint` runs mypy over the package; here mypy checks a caller, with the project's own settings, less
the heavy libraries the package imports (torch, pandas, numpy, ...): they are skipped, stubs too, their types
read as Any. Checked in full, they took mypy about 20 CPU-seconds in a fresh clone (no cache), against under 2
without them; launch()'s and start_ranks()'s keywords are the package's own, so the checks below hold either way.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
import uuid
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is not installed: pip install -e '.[test]' brings it")

REPO = Path(__file__).resolve().parents[2]


SKIPPED = ["torch", "torch.*", "torchvision", "torchvision.*", "numpy", "numpy.*", "pandas", "pandas.*",
           "matplotlib", "matplotlib.*", "IPython", "IPython.*"]  # fmt: skip


def _config(folder: Path) -> Path:
    """pyproject.toml's [tool.mypy] settings, and one override more: the heavy libraries are skipped."""
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    lines = ["[mypy]"] + [
        f"{key} = {_ini(value)}" for key, value in settings.items() if key not in ("files", "overrides")
    ]
    for override in [
        *settings.get("overrides", []),
        {"module": SKIPPED, "follow_imports": "skip", "follow_imports_for_stubs": True},
    ]:
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        lines += [f"[mypy-{','.join(modules)}]"] + [
            f"{k} = {_ini(v)}" for k, v in override.items() if k != "module"
        ]
    config = folder / "mypy.ini"
    config.write_text("\n".join(lines) + "\n")
    return config


def _ini(value) -> str:
    """A TOML value as mypy.ini writes it: a list comma-separated, True/False as Python prints them."""
    return ",".join(value) if isinstance(value, list) else str(value)


def _mypy(path: Path) -> list[str]:
    """mypy's error lines about `path`, with its cache beside it (a fresh clone has none).

    mypy would replay a cached module's errors under the path it had then: each caller differs from
    the last one (a comment) so that it is checked afresh.
    """
    path.write_text(f"# {uuid.uuid4()}\n{path.read_text()}")
    config = _config(path.parent)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-error-summary",
            "--config-file",
            str(config),
            "--cache-dir",
            str(path.parent / ".mypy_cache"),
            str(path),
        ],  # fmt: skip
        cwd=REPO,  # where the editable install's package is found
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode in (0, 1), out.stdout + out.stderr  # 2: mypy itself failed
    return [line for line in out.stdout.splitlines() if line.startswith(f"{path}:") and ": error:" in line]


@pytest.mark.timeout(300)
def test_a_mistyped_launch_keyword_is_a_type_error(tmp_path):
    caller = tmp_path / "caller.py"
    caller.write_text(
        textwrap.dedent(
            """\
            from ddp_helpers import launch, start_ranks

            launch("x.py", "--steps", 3, nproc=2, timeout=5, env={"A": "1"}, run_dir="runs/x")
            launch("x.py", nproc=2, tiemout=5)
            launch("x.py", nproc="2")
            launch("x.py", gpus=0)
            start_ranks(2, nprocs=2)
            start_ranks(timeout="5")
            """
        )
    )
    errors = _mypy(caller)
    assert [line.split(":")[1] for line in errors] == ["5", "6", "7", "8", "9"], errors  # line 4 is right
    assert 'Unexpected keyword argument "tiemout" for "launch"' in errors[0]
    assert 'Argument "nproc" to "launch" has incompatible type "str"' in errors[1]
    assert 'Unexpected keyword argument "gpus" for "launch"' in errors[2]  # a test's stand-in, not an option
    assert 'Unexpected keyword argument "nprocs" for "start_ranks"' in errors[3]
    assert 'Argument "timeout" to "start_ranks" has incompatible type "str"' in errors[4]
