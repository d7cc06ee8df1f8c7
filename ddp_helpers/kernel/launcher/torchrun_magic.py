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
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from IPython.core.magic import Magics, cell_magic, magics_class

from ddp_helpers.errors import InvalidLaunchArguments
from ddp_helpers.kernel.launcher.options import (
    OPTIONS,
    Option,
    add_flags,
    fill_doc_slot,
    flags_doc,
    given_options,
)


class _RefusingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # not SystemExit: a cell shows the reason and stops
        raise InvalidLaunchArguments(f"%%torchrun: {message}\n{self.format_usage().strip()}")


def magic_parser(options: Iterable[Option] = OPTIONS) -> argparse.ArgumentParser:
    """``%%torchrun``'s flags: one per declared option, each defaulting to None (`launch`'s default)."""
    parser = _RefusingParser(prog="%%torchrun", add_help=False)
    add_flags(parser, options)
    parser.add_argument("--args", default="", help="arguments for the script, quoted: --args '--steps 5'")
    return parser


def parse_magic_line(line: str) -> tuple[Path | None, list[str], dict[str, Any]]:
    """(run_dir, script arguments, launch options) from a ``%%torchrun`` line, quoted as a shell would."""
    try:
        words = shlex.split(line)
    except ValueError as err:
        raise InvalidLaunchArguments(f"%%torchrun: cannot split {line!r}: {err}") from None
    opts = magic_parser().parse_args(words)
    try:
        script_args = shlex.split(opts.args)
    except ValueError as err:
        raise InvalidLaunchArguments(f"%%torchrun --args: {err}") from None
    options = given_options(opts)
    run_dir = options.pop("run_dir", None)
    return (Path(run_dir) if run_dir else None), script_args, options


@magics_class
class TorchrunMagics(Magics):
    @cell_magic
    def torchrun(self, line: str, cell: str) -> Any:
        """Write this cell to a script and run it with torchrun; see `ddp_helpers.launch`.

        Options (each unset one keeps `launch`'s default):
            {flags}
            --args ARGS: the script's own arguments, quoted: --args '--steps 5'
        """
        from ddp_helpers.kernel.launcher.cell_source import as_in_editor, check_compiles
        from ddp_helpers.kernel.launcher.config import default_run_dir
        from ddp_helpers.kernel.launcher.runner import launch

        run_dir, script_args, options = parse_magic_line(line)
        run_dir = run_dir or default_run_dir("cell")
        script = run_dir / "cell.py"
        code = as_in_editor(cell)  # cell.py's line numbers are the editor's
        check_compiles(code, str(script))  # a typo fails here, not after every rank has started
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(code)
        return launch(script, *script_args, run_dir=run_dir, **options)


TorchrunMagics.torchrun.__doc__ = fill_doc_slot(
    TorchrunMagics.torchrun.__doc__, "flags", lambda indent: flags_doc(indent=indent)
)


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(TorchrunMagics)
