# Rank 1 dies from SIGKILL, as under the out-of-memory killer: no traceback at all.
import os
import signal
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} up")
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(30)
