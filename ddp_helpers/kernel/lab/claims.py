"""Checks a learner reads: a claim a notebook makes, checked on this machine, with the evidence shown."""

from __future__ import annotations

from typing import Any

PASS_MARK = "✓"
FAIL_MARK = "✗"


class ClaimFailed(AssertionError):
    """A claim a notebook made did not hold on this machine. The message says the claim and what was seen."""

    def _render_traceback_(self) -> list[str]:
        # the claim and its evidence are the whole story: the frames inside this module add nothing
        return f"{type(self).__name__}: {self}".splitlines()


def check(claim: str, holds: Any, evidence: str = "") -> None:
    """Print ``✓ claim: evidence`` when ``holds`` is true; raise ``ClaimFailed`` with ``✗ claim: evidence`` else."""
    claim, evidence = claim.strip(), str(evidence).strip()
    if not claim:
        raise ValueError("check() needs the claim in words: what is being checked")
    text = f"{claim}: {evidence}" if evidence else claim
    if not isinstance(holds, bool):
        holds = bool(holds)  # numpy and torch booleans; a tensor of many values raises here, as it should
    if not holds:
        raise ClaimFailed(f"{FAIL_MARK} {text}")
    print(f"{PASS_MARK} {text}")


def check_equal(claim: str, seen: Any, expected: Any, evidence: str = "") -> None:
    """``check(claim, seen == expected)``, with both values in the evidence: "seen X, expected X"."""
    shown = f"seen {seen!r}, expected {expected!r}" if seen != expected else f"{seen!r}"
    check(claim, seen == expected, f"{evidence}; {shown}" if evidence else shown)
