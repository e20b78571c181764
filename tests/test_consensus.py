"""Choosing the attempt the others agree with (prompted reasoning)."""

from __future__ import annotations

from kimi_server.engines.llamacpp.consensus import conclusion, most_agreed


def test_the_majority_conclusion_wins_over_the_first_attempt() -> None:
    attempts = [
        "17 * 23 equals 401.",
        "17 * 23 equals 391.",
        "Working it out:\n17 * 20 = 340\n17 * 3 = 51\nSo 17 * 23 equals 391.",
        "The product is 441.",
    ]
    assert most_agreed(attempts) in (1, 2)


def test_numbers_are_compared_whole() -> None:
    attempts = ["It evaluates to 2.5.", "It evaluates to 2.", "It evaluates to 2.5."]
    assert most_agreed(attempts) in (0, 2)


def test_code_boilerplate_does_not_outvote_the_result() -> None:
    listing = "```python\nprint(15 / 100 * 80)\n```\n```output\n120.000000000000014999999\n```"
    attempts = [
        listing,
        listing.replace("120.000000000000014999999", "12.00000000000433333"),
        "15% of 80 is 12.",
        "The answer is 12.",
    ]
    assert most_agreed(attempts) in (2, 3)


def test_a_degenerate_sample_never_wins() -> None:
    attempts = ["So the answer is " + "7385462" * 12, "The answer is 300.", "The answer is " + "7385462" * 12]
    assert most_agreed(attempts) == 1


def test_one_attempt_or_none_in_common() -> None:
    assert most_agreed(["only"]) == 0
    assert most_agreed(["a b", "c d", "e f"]) == 0  # a tie goes to the earliest


def test_conclusion_skips_fences_and_blank_lines() -> None:
    assert conclusion("Steps\nThe answer is 5.\n```\n\n") == "The answer is 5."
    assert conclusion("   ") == "   "
