# Ignores SIGTERM and ticks: only SIGKILL stops it, so an interrupt waits for the whole grace period.
import os
import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
for i in range(600):
    print(f"rank {os.environ['RANK']} tick {i}", flush=True)
    time.sleep(1)
