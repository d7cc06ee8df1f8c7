"""Live ranks: DDP ranks that stay up between cells, and the kernel that drives them.

Both ends of one socket: `ranks` and `magics` run in the notebook kernel, `server` runs in every rank,
and `protocol` is what the two agree on (both sides load it, so it imports nothing of either).
"""
