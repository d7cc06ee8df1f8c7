"""The workers' teardown: destroy_process_group, except where torch 2.7's gloo can hang in it."""

from __future__ import annotations

import pytest

from ddp_helpers import teardown


@pytest.mark.parametrize(
    "version, hangs",
    [
        ("2.7.1+cu126", True),
        ("2.7.1", True),
        ("2.8.0", False),
        ("2.14.1+cu130", False),
        ("2.10.0a0+git1", False),
    ],
)
def test_only_torch_2_7_gloo_skips_the_destroy(version, hangs):
    assert teardown.gloo_destroy_can_hang(version) is hangs


def test_without_a_process_group_it_does_nothing():
    teardown.destroy_process_group()  # must not raise when init_process_group never ran
