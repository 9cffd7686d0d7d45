"""The healthy cards of a run: the cards the volume may use, as the ladder left them.

``device`` names the cards without faults, ``compute`` takes out the wrong and the slow
ones, ``interconnect`` the card in every slow pair; each reports ``healthy_cards`` in its
facts (also when it failed: a failing stage keeps its facts). The latest of them in the
ladder's order that reported is the run's answer.
"""

from __future__ import annotations

from typing import Any

CARD_STAGES = ("interconnect", "compute", "device")


def healthy_cards(stages: list[dict[str, Any]]) -> list[int] | None:
    """The run's healthy cards from its stage rows, or None when no stage reported them."""
    by_name = {row.get("stage"): row for row in stages}
    for name in CARD_STAGES:
        facts = (by_name.get(name) or {}).get("facts") or {}
        cards = facts.get("healthy_cards")
        if isinstance(cards, list) and all(isinstance(c, int) and not isinstance(c, bool)
                                           for c in cards):
            return sorted(cards)
    return None
