"""``%%torchrun``: run a notebook cell as a DDP script under torchrun.

    %load_ext ddp_helpers
    %%torchrun --nproc 2 --timeout 60 --args '--steps 5'
    import torch.distributed as dist
    dist.init_process_group("gloo")
    ...

The cell is written to ``<run_dir>/cell.py`` (a real file: functions defined in the kernel
cannot reach fresh processes) and launched with `launch`. The cell's value is the
`LaunchResult`. Options not given keep `launch`'s defaults.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from IPython.core.magic import Magics, cell_magic, magics_class

from ..errors import InvalidLaunchArguments


class _RefusingParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # not SystemExit: a cell shows the reason and stops
        raise InvalidLaunchArguments(f"%%torchrun: {message}\n{self.format_usage().strip()}")


def _show_ranks(text: str) -> object:
    if text in ("all", "none"):
        return text
    try:
        return [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'all', 'none' or comma-separated ranks, got {text!r}") from None


def magic_parser() -> argparse.ArgumentParser:
    """``%%torchrun``'s options; each defaults to None, which leaves `launch`'s own default."""
    parser = _RefusingParser(prog="%%torchrun", add_help=False)
    parser.add_argument("--nproc", type=int, help="processes (default: GPUs, or 2 on the CPU)")
    parser.add_argument("--backend", help="auto, gloo or nccl")
    parser.add_argument("--timeout", type=float, help="seconds without progress before the run is killed")
    parser.add_argument("--run-dir", help="where the script, logs and metrics go")
    parser.add_argument("--max-restarts", type=int)
    parser.add_argument("--show-ranks", type=_show_ranks, help="'all', 'none' or comma-separated ranks")
    parser.add_argument("--args", default="", help="arguments for the script, quoted: --args '--steps 5'")
    return parser


def parse_magic_line(line: str) -> tuple[Path | None, list[str], dict[str, Any]]:
    """(run_dir, script arguments, launch options) from a ``%%torchrun`` line, quoted as a shell would."""
    try:
        words = shlex.split(line)
    except ValueError as err:
        raise InvalidLaunchArguments(f"%%torchrun: cannot split {line!r}: {err}") from None
    opts = vars(magic_parser().parse_args(words))
    try:
        script_args = shlex.split(opts.pop("args"))
    except ValueError as err:
        raise InvalidLaunchArguments(f"%%torchrun --args: {err}") from None
    run_dir = opts.pop("run_dir")
    options = {name: value for name, value in opts.items() if value is not None}
    return (Path(run_dir) if run_dir else None), script_args, options


@magics_class
class TorchrunMagics(Magics):
    @cell_magic
    def torchrun(self, line: str, cell: str) -> Any:
        """Write this cell to a script and run it with torchrun; see `ddp_helpers.launch`.

        Options: --nproc N, --backend B, --timeout S, --run-dir DIR, --max-restarts N,
        --show-ranks all|none|0,1, --args '--steps 5' (the script's arguments, quoted).
        """
        from .config import default_run_dir
        from .runner import launch

        run_dir, script_args, options = parse_magic_line(line)
        run_dir = run_dir or default_run_dir("cell")
        script = run_dir / "cell.py"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(cell)
        return launch(script, *script_args, run_dir=run_dir, **options)


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(TorchrunMagics)
