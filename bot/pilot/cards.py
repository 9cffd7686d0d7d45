"""The healthy cards of a run: the cards the volume may use, as the ladder left them.

The rule is the runner's (``runner.spec.healthy_cards``: the latest card stage that
reported them), so the bot reads a run's stage rows exactly as the volume reads its facts.
"""

from __future__ import annotations

from typing import Any

from runner.spec import CARD_STAGES
from runner.spec import healthy_cards as cards_from_facts

__all__ = ["CARD_STAGES", "healthy_cards"]


def healthy_cards(stages: list[dict[str, Any]]) -> list[int] | None:
    """The run's healthy cards from its stage rows, or None when no stage reported them."""
    return cards_from_facts({str(row.get("stage")): row.get("facts") or {} for row in stages})
