"""The decision prompt at the end of an interactive `preflight run` asks again on a typo."""

from __future__ import annotations

from typing import Any

from bot.cli.app import ask_decision


def test_a_mistyped_answer_is_asked_again() -> None:
    answers = iter(["aprove", " Approve ", "never reached"])
    said: list[str] = []
    assert ask_decision(lambda: next(answers), lambda text, **_: said.append(text)) == "approve"
    assert len(said) == 1 and "'aprove' is not a decision" in said[0]


def test_an_empty_answer_decides_later() -> None:
    said: list[Any] = []
    assert ask_decision(lambda: "  ", lambda text, **_: said.append(text)) is None
    assert said == []
