"""Notebook 06's exercises: a rank's start-up on a node of a multi-node job, and its main loop's frame.

The live ranks all sit on one machine, where RANK and LOCAL_RANK are equal and so are WORLD_SIZE and
LOCAL_WORLD_SIZE: there, the mistakes these exercises name cannot show. So the answer is a function of
an environment, `env`, that observe calls with pretend ones: ranks of a job of 2 nodes x 4 GPUs (8 ranks),
and of 2 nodes x 2 CPU processes. Stand-ins record what the function asks of the machine: `torch.cuda`
reports the pretend node's GPUs and records `set_device` (refusing an index the node does not have, as
CUDA does), and `dist` records `init_process_group`, `barrier` and `destroy_process_group` instead of
running them (the live ranks' process group stays up). Everything else reaches torch itself. During each
call `os.environ` holds the pretend process's variables too, as a worker's does under torchrun: an answer
that reads them there, as a script does, is judged by what it does with them. A verdict names each call by
the pretend process it stands for, "main(env of RANK 5 of 8: node 1, LOCAL_RANK 1)", after the live rank
that made it.
"""

from __future__ import annotations

from ddp_helpers.chapters.ch06_scaling_out.ch06_init import INIT
from ddp_helpers.chapters.ch06_scaling_out.ch06_main import MAIN

EXERCISES = (INIT, MAIN)
