"""Start train.py's DDP processes with torch.multiprocessing.spawn instead of torchrun.

    python spawn_train.py --nproc 2 --steps 20        # every flag but --nproc goes to train.py

mp.spawn pickles its target function by reference (module and name). A child process imports
that module afresh, so the function must live in a file: one defined in a notebook cell exists
only inside the kernel, and the children fail with "Can't get attribute ...".

Compared with torchrun, this script has to do by hand what torchrun gives for free: pick a port,
set RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, and it gets no elastic restarts,
no per-rank error files and no per-rank log files (all ranks share one stdout).
"""

import argparse
import os
import runpy
import socket
import sys

import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
# train.py beside this file (a notebook copies both into its runs/workers/ folder), else the package's own
TRAIN = next(
    path
    for path in (os.path.join(HERE, "train.py"), os.path.join(HERE, "..", "..", "workers", "train.py"))
    if os.path.exists(path)
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_rank(local_rank: int, world_size: int, port: int, train_args: list[str]) -> None:
    # what torchrun would have set in each worker's environment
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    sys.argv = [TRAIN, *train_args]
    runpy.run_path(TRAIN, run_name="__main__")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2)
    args, train_args = parser.parse_known_args()
    # start_method "spawn": fresh interpreters, never a fork of this process
    mp.spawn(run_rank, args=(args.nproc, free_port(), train_args), nprocs=args.nproc, join=True)
