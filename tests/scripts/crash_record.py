# Rank 1 divides by zero; @record puts the traceback into torchelastic's error file.
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    rank = int(os.environ["RANK"])
    print(f"rank {rank} starting")
    if rank == 1:
        return 1 / 0
    time.sleep(30)  # rank 0 would go on; torchrun stops it when rank 1 fails


if __name__ == "__main__":
    main()
