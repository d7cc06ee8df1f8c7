# Written elsewhere: no @record, lots of output, then rank 1 fails.
import os
import time

rank = int(os.environ["RANK"])
for i in range(300):
    print(f"rank {rank} chatter {i}")
if rank == 1:
    raise ValueError("bad shape: expected 3 channels, got 1")
time.sleep(30)
