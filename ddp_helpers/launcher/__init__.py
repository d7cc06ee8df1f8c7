"""The kernel side of a launch: runs in the notebook kernel (or the command line), never in a rank.

`runner.launch` starts torchrun (through `torchrun_agent`, which runs in the agent's own process),
follows each rank's output and metrics, stops the run on interrupt, and diagnoses a failed rank.
"""
