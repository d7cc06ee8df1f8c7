# Prints a line a second for a long time: something to interrupt.
import os
import time

for i in range(600):
    print(f"rank {os.environ['RANK']} tick {i}", flush=True)
    time.sleep(1)
