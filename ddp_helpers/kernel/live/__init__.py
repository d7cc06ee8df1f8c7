"""Live ranks: DDP ranks that stay up between cells, and the kernel that drives them.

Both ends of one socket. In every rank, under torchrun: `server` (it imports `protocol` and the rank
side's `ddp_helpers.rank.distributed`, nothing of the kernel side). In the notebook kernel: `ranks`
(`LiveRanks`, `start_ranks`), built from `session` (start, the one receive loop, stop: with the
launcher's `start_run`, `stop_run` and `RunFollower`), `calls` (one request, from send to every
reply), `cells` (each request's id and code), `results` (values and errors), `recovery`
(interrupts, hangs, deaths, and where a stuck rank waits), and `magics` (``%ranks``,
``%%ranks``). `protocol` holds the typed messages both ends exchange; both sides load it, so it
imports nothing of either.
"""
