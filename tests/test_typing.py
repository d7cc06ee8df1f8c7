"""A type checker sees launch()'s options: a mistyped keyword is an error before anything runs.

`make lint` runs mypy over the package; here mypy checks a caller, with the project's own settings.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is not installed: pip install -e '.[test]' brings it")

REPO = Path(__file__).resolve().parent.parent


def _mypy(path: Path) -> list[str]:
    """mypy's error lines about `path` (its cache is the repository's .mypy_cache, which make lint fills).

    mypy would replay a cached module's errors under the path it had then: each caller differs from
    the last one (a comment) so that it is checked afresh.
    """
    path.write_text(f"# {uuid.uuid4()}\n{path.read_text()}")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", str(path)],
        cwd=REPO,  # pyproject.toml's [tool.mypy]
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
