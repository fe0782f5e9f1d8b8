"""The vote's choice (steps/voting.py), as plain data: the gate eliminates, the shortest
survivor wins, the first declared on a tie, the shortest draft when none survives."""

from __future__ import annotations

from orchestrator.run.records import Candidate
from orchestrator.steps.voting import choose, step


def candidate(angle: str, chars: int | None, report: str = "") -> Candidate:
    return Candidate(
        angle=angle, chars=chars, passed=chars is not None and not report, report=report
    )


def test_a_draft_the_gate_failed_loses_to_a_longer_one_it_passed() -> None:
    winner, why = choose([candidate("a", 100, "filler_word:x"), candidate("b", 300)])
    assert winner.angle == "b"
    assert (
        why
        == "the only draft the gate passed (300 characters); the gate eliminated a: filler_word:x"
    )


def test_among_survivors_the_shortest_wins_and_a_tie_goes_to_the_first_declared() -> None:
    winner, why = choose([candidate("a", 300), candidate("b", 200), candidate("c", 250)])
    assert winner.angle == "b" and "(a 300, b 200, c 250 characters)" in why
    tie, why = choose([candidate("a", 200), candidate("b", 200)])
    assert tie.angle == "a" and why.endswith("a tie goes to the angle declared first")


def test_with_no_survivor_the_shortest_draft_goes_to_review() -> None:
    no_draft = Candidate(angle="c", report="no draft (max_turns)")
    winner, why = choose(
        [candidate("a", 300, "echo"), candidate("b", 200, "missing_ticket_id"), no_draft]
    )
    assert winner.angle == "b"
    assert why.startswith("no draft passed the gate, so the shortest (200 characters) goes")
    assert "c: no draft (max_turns)" in why


def test_an_angles_agent_state_is_named_for_it() -> None:
    assert step("warm") == "draft-warm"
