"""Notebook 04's exercises: save a checkpoint that resumes exactly, choose it on rank 0, and resume from it.

04-save: every rank's random state gathered, rank 0 alone writes the whole state to a temporary file that
`os.replace` puts over the previous checkpoint, then a barrier. The setup leaves an older checkpoint at
the path: `os.replace` gives the path a new inode, a write in place keeps the old one.
04-choose: each rank sees another listing of the folder (the newest file has not reached rank 1's view
yet); rank 0 chooses, every rank loads its choice onto its own device, into the raw model, then wraps.
04-resume: from a checkpoint written mid-epoch, the run must continue as the uninterrupted one did. The
uninterrupted run is written out here in plain torch math (`simulate`): a bias-free float64 Linear that
starts at zero, one-hot samples, a dropout-like mask drawn from the global CPU generator at each step,
SGD with momentum. Each missing piece of the resume (optimizer state, RNG, the loader's generator, the
skipped batches) moves the masks, the weights or the samples trained in its own way.
"""

from __future__ import annotations

from ddp_helpers.chapters.ch04_checkpointing.ch04_choose import CHOOSE
from ddp_helpers.chapters.ch04_checkpointing.ch04_resume import RESUME
from ddp_helpers.chapters.ch04_checkpointing.ch04_save import SAVE

EXERCISES = (SAVE, CHOOSE, RESUME)
