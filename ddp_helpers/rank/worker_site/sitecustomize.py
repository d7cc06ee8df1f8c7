"""Run by Python in every rank before the script's first line: register the rank for stack dumps.
The launcher puts this folder first on the ranks' PYTHONPATH; the variable is removed so a rank's children
do not register, and the sitecustomize this one hides (Debian's) still runs."""

from __future__ import annotations

import importlib
import os
import sys


def _register() -> None:
    if "LOCAL_RANK" not in os.environ:
        return
    try:  # the contract's names only (no torch): stack_dumps is imported only to register
        from ddp_helpers.run_contract import STACK_DUMPS_ENV
    except ImportError:  # an environment without the package: the rank runs, without stack dumps
        return
    if os.environ.pop(STACK_DUMPS_ENV, None) != "1":
        return
    from ddp_helpers.rank import stack_dumps

    stack_dumps.register_in_run()


def _run_the_hidden_one() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    this = sys.modules.pop(__name__)
    path = sys.path[:]
    sys.path[:] = [entry for entry in path if os.path.abspath(entry or ".") != here]
    try:
        importlib.import_module(__name__)
    except ModuleNotFoundError as missing:
        if missing.name != __name__:
            raise  # the hidden one's own import failed: Python's start-up reports it, as without this one
        sys.modules[__name__] = this
    finally:
        sys.path[:] = path


_register()
_run_the_hidden_one()
