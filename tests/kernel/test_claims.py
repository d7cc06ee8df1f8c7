"""check(): a notebook's claim, printed with its evidence when it holds, raised with it when it does not."""

from __future__ import annotations

import pytest

from ddp_helpers import ClaimFailed, check, check_equal


def test_a_claim_that_holds_prints_a_tick_and_the_evidence(capsys):
    check("the two ranks drew disjoint shards", True, "16 + 16 of 32 samples")
    assert capsys.readouterr().out == "✓ the two ranks drew disjoint shards: 16 + 16 of 32 samples\n"


def test_a_claim_that_fails_raises_with_the_claim_and_the_evidence(capsys):
    with pytest.raises(ClaimFailed, match=r"^✗ every rank holds the same weights: checksums 1.0, 2.0$"):
        check("every rank holds the same weights", False, "checksums 1.0, 2.0")
    assert capsys.readouterr().out == ""


def test_a_failed_claim_is_an_assertion_error_so_pytest_and_papermill_show_it_as_one():
    assert issubclass(ClaimFailed, AssertionError)


def test_numpy_and_torch_booleans_are_read_as_truth_values(capsys):
    import torch

    check("the tensors are equal", torch.equal(torch.ones(2), torch.ones(2)), "")
    check("a 0-d tensor that is true", torch.tensor(True))
    assert capsys.readouterr().out.count("✓") == 2
    with pytest.raises(ClaimFailed):
        check("a 0-d tensor that is false", torch.tensor(False))


def test_a_tensor_of_many_values_is_no_truth_value():
    import torch

    with pytest.raises(RuntimeError, match="ambiguous"):
        check("ambiguous", torch.tensor([True, False]))


def test_a_claim_needs_words():
    with pytest.raises(ValueError, match="claim in words"):
        check("  ", True)


def test_check_equal_shows_both_values_when_they_differ(capsys):
    check_equal("the world size", 2, 2, "read from every rank")
    assert capsys.readouterr().out == "✓ the world size: read from every rank; 2\n"
    with pytest.raises(ClaimFailed, match=r"✗ the epochs printed: seen \[0\.5\], expected \[0\.5, 0\.4\]"):
        check_equal("the epochs printed", [0.5], [0.5, 0.4])
