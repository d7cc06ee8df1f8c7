# A progress bar that redraws one line with "\r" and never ends it until the end: no newline for seconds.
import sys
import time

for i in range(int(sys.argv[1])):
    print(f"\rstep {i}", end="", flush=True)
    time.sleep(0.5)
print("\rdone")
