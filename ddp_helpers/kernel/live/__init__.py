"""Live ranks: DDP ranks that stay up between cells, and the kernel that drives them.

In every rank, under torchrun: `rank/live_server.py`. In the notebook kernel: `ranks` (`LiveRanks`,
`start_ranks`, one request from send to every reply), `session` (start, the one receive loop, stop),
`results` (values and errors), `recovery` (interrupts, hangs, deaths, where a stuck rank waits) and
`live_magics` (``%ranks``, ``%%ranks``). `rank/live_protocol.py` holds the messages both ends exchange.
"""
