"""``%%torchrun``: run a notebook cell as a DDP script under torchrun.

    %load_ext ddp_helpers
    %%torchrun --nproc 2 --timeout 60
    import torch.distributed as dist
    dist.init_process_group("gloo")
    ...

The cell is written to ``<run_dir>/cell.py`` (a real file: functions defined in the kernel
cannot reach fresh processes) and launched with `launch`. The cell's value is the
`LaunchResult`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .launch import launch
from .launch_config import default_run_dir


@magics_class
class TorchrunMagics(Magics):
    @magic_arguments()
    @argument("--nproc", type=int, default=None, help="processes (default: GPUs, or 2 on the CPU)")
    @argument("--backend", default="auto", help="auto, gloo or nccl")
    @argument("--timeout", type=float, default=None, help="seconds without progress before the run is killed")
    @argument("--run-dir", default=None, help="where the script, logs and metrics go")
    @argument("--max-restarts", type=int, default=0)
    @argument("--show-ranks", default="all", help="'all', 'none' or comma-separated ranks")
    @argument("--args", default="", help="arguments for the script, quoted: --args '--steps 5'")
    @cell_magic
    def torchrun(self, line: str, cell: str):
        """Write this cell to a script and run it with torchrun; see `ddp_helpers.launch`."""
        opts = parse_argstring(self.torchrun, line)
        show: object = opts.show_ranks
        if show not in ("all", "none"):
            show = [int(r) for r in str(show).split(",") if r.strip()]
        run_dir = Path(opts.run_dir) if opts.run_dir else default_run_dir("cell")
        script = Path(run_dir) / "cell.py"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(cell)
        return launch(script, *shlex.split(opts.args), nproc=opts.nproc, backend=opts.backend, timeout=opts.timeout,
                      run_dir=run_dir, max_restarts=opts.max_restarts, show_ranks=show)  # fmt: skip


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(TorchrunMagics)
