# A chatty job: each rank prints many lines as fast as it can (argv[1], default 50,000), no torch needed.
import os
import sys

rank = os.environ["RANK"]
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000):
    print(f"rank {rank} line {i}: loss 0.123456 lr 0.001 samples/s 1234.5")
