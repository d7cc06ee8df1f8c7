"""The workers' teardown: destroy_process_group on nccl; on gloo, an exit without finalization."""

from __future__ import annotations

from ddp_helpers import teardown


def test_without_a_process_group_it_does_nothing():
    teardown.destroy_process_group()  # must not raise when init_process_group never ran
