"""On a machine without a GPU the device stage's memory is the system RAM, and says so."""

from __future__ import annotations

from runner.stages.device import cpu_facts


def test_cpu_facts_name_the_system_ram_not_a_card_s_memory() -> None:
    facts = cpu_facts()
    assert "memory_gib" not in facts  # a card's memory, which a CPU node has not
    assert facts["ram_gib"] > 0 and facts["cpu_count"] >= 1

