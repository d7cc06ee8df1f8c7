"""Two checkpoint faults that `load_latest`'s fallback would hide: ranks that see different files, and a save
killed mid-write (RLIMIT_FSIZE: the kernel kills the process at byte N).

    torchrun --nproc-per-node 2 checkpoint_faults.py choose --views DIR
    python checkpoint_faults.py crash --folder DIR --crash-at-byte N
"""

import argparse
import os
import resource
import signal
from pathlib import Path
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from ddp_helpers.chapters.ch04_checkpointing import checkpoint
from ddp_helpers.rank import teardown
from ddp_helpers.rank.distributed import setup_distributed
from ddp_helpers.rank.metrics import report
from ddp_helpers.run_contract import RUN_DIR_ENV


def choose(views: str) -> None:
    info = setup_distributed()
    if info.world_size < 2:
        raise SystemExit("choose needs two ranks or more, to disagree: run it under torchrun")
    view = Path(views) / f"rank{info.rank}"  # what this rank sees of the checkpoint folder
    alone, _ = checkpoint.load_latest(view)  # each rank choosing for itself
    assert alone is not None, f"no checkpoint in {view}"
    ckpt, path = checkpoint.load_latest_on_every_rank(view, map_location=info.device)  # rank 0 chooses
    assert ckpt is not None, f"rank 0 found no checkpoint in its view of {views}"
    report(info.rank, info.world_size, alone=alone["step"], resumed=ckpt["step"], path=str(path))


def crash_while_saving(folder: str, crash_at_byte: int) -> None:
    """Save step 1 whole; then die after `crash_at_byte` bytes of step 2's checkpoint."""
    weights = torch.Generator().manual_seed(0)
    model = {"weight": torch.randn(512, 512, generator=weights)}  # 1 MiB
    state: dict[str, Any] = {"model": model, "step": 1}
    first = checkpoint.save_checkpoint(state, folder, 1)
    print(f"saved {first.name}: {first.stat().st_size} bytes", flush=True)
    # Python ignores SIGXFSZ (a write past the limit then fails with EFBIG, and `finally` blocks clean
    # up); its default action ends the process on the spot, as a power cut or SIGKILL would
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # no core file
    resource.setrlimit(resource.RLIMIT_FSIZE, (crash_at_byte, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    print(f"saving step 2; the kernel kills this process at byte {crash_at_byte}", flush=True)
    model["weight"].add_(1.0)
    state["step"] = 2
    checkpoint.save_checkpoint(state, folder, 2)
    raise SystemExit(f"the save of step 2 finished: its file is under {crash_at_byte} bytes")


@record
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fault", choices=["choose", "crash"])
    parser.add_argument("--views", help="choose: rank r lists VIEWS/rank{r}")
    parser.add_argument("--folder", help="crash: the checkpoint folder")
    parser.add_argument("--crash-at-byte", type=int, default=256 * 1024)
    args = parser.parse_args()
    os.environ.setdefault(RUN_DIR_ENV, "runs/checkpoint_faults")  # where report() writes summary.json
    if args.fault == "choose":
        choose(args.views)
    else:
        crash_while_saving(args.folder, args.crash_at_byte)


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
