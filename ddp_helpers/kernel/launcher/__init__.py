"""The kernel side of a launch: runs in the notebook kernel (or the command line), never in a rank.

`runner.launch` starts torchrun (through `torchrun_agent`, which runs in the agent's own process) and
stops the run on interrupt, a hang or its end; `run_follower.RunFollower` follows each rank's output and
metrics and diagnoses a failed rank (live ranks use it too). The process a launch starts (an agent
forked from a warm server, a fresh agent, or the script alone) is one class each behind
`processes.RunProcess`.
"""
