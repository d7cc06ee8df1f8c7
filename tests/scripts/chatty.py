# Prints many long lines fast from every rank, and logs metrics like a real worker.
import os
import sys

from ddp_helpers.rank.metrics import MetricsWriter

rank = int(os.environ["RANK"])
lines = int(sys.argv[1]) if len(sys.argv) > 1 else 200
writer = MetricsWriter(os.environ["DDP_RUN_DIR"], rank)
writer.write_plan(total_steps=lines // 50)
for i in range(lines):
    print(f"rank {rank} line {i} " + "x" * 300)
    if i % 50 == 49:
        writer.log(step=(i + 1) // 50, loss=1.0 / (i + 1))
print(f"rank {rank} stderr line", file=sys.stderr)
writer.write_summary({"lines": lines})
writer.close()
