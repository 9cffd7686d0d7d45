"""What the user sees of every card, and the healthy cards the bot keeps for the volume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.messages.cards import cards_message
from bot.messages.model import Table, Text
from bot.pilot.cards import healthy_cards
from tests.bot.fakes import pilot_script
from tests.bot.runs import run_of
from tests.bot.test_service import IDS, make, submit


def device_facts() -> dict[str, Any]:
    cards = {str(i): {"index": i, "name": "NVIDIA H200", "bus_id": f"0000:{0x18 + i:02x}:00.0",
                      "ecc_volatile_uncorrected": 0, "rows_pending": 0, "verdict": "ok",
                      "reasons": [], "pcie": {"gen_current": 5, "gen_max": 5,
                                              "width_current": 16, "width_max": 16}}
             for i in range(8)}
    cards["5"].update(ecc_volatile_uncorrected=2, verdict="fault",
                      reasons=["2 volatile uncorrected ECC error(s)"])
    return {"count": 8, "cards": cards, "healthy_cards": [0, 1, 2, 3, 4, 6, 7]}


def compute_facts() -> dict[str, Any]:
    cards = {str(i): {"bf16_tflops": 790.0, "bf16_fraction_of_peak": 0.8, "verdict": "ok",
                      "reasons": []} for i in (0, 1, 2, 3, 4, 6, 7)}
    cards["3"].update(bf16_tflops=412.0, bf16_fraction_of_peak=0.42, verdict="slow",
                      reasons=["bf16 matmul 412 TFLOP/s, 0.52x its peers' median 790"])
    return {"cards": cards, "healthy_cards": [0, 1, 2, 4, 6, 7]}


def interconnect_facts() -> dict[str, Any]:
    return {"cards": [0, 1, 2, 4, 6, 7], "library": "nccl", "busbw_gbps": 402.5,
            "link": {"verdict": "no reference", "reference_gbps": None},
            "healthy_cards": [0, 1, 2, 4, 6, 7]}


def stage_rows(*, link: bool = True) -> list[dict[str, Any]]:
    rows = [{"stage": "device", "state": "passed", "facts": device_facts()},
            {"stage": "compute", "state": "failed", "facts": compute_facts()}]
    if link:
        rows.append({"stage": "interconnect", "state": "passed", "facts": interconnect_facts()})
    return rows


def test_the_card_table_names_the_bad_cards_and_the_link() -> None:
    message = cards_message(run_of(id="r1", name="demo"), stage_rows())
    assert message is not None and message.key == "cards"
    table = next(b for b in message.blocks if isinstance(b, Table))
    assert len(table.rows) == 8
    assert table.rows[3][3:] == ("412", "0.42", "0", "gen5/5 x16/16", "SLOW ⚠")
    assert table.rows[5][5] == "2" and table.rows[5][-1] == "FAULT ✗"
    assert table.rows[0][-1] == "ok"
    errors = [b.text for b in message.blocks if isinstance(b, Text) and b.style == "error"]
    assert errors == ["GPU 3 (0000:1b:00.0): bf16 matmul 412 TFLOP/s, 0.52x its peers' "
                      "median 790",
                      "GPU 5 (0000:1d:00.0): 2 volatile uncorrected ECC error(s)"]
    texts = [b.text for b in message.blocks if isinstance(b, Text)]
    assert "Healthy cards: 0, 1, 2, 4, 6, 7 (6 of 8)" in texts
    assert ("Interconnect: all-reduce busbw 402.5 GB/s over 6 cards (nccl), no reference "
            "for this model and card count") in texts
    assert any("replacement node" in t for t in texts)


def test_no_card_table_for_a_cpu_run() -> None:
    assert cards_message(run_of(id="r1", name="demo"),
                         [{"stage": "device", "state": "passed", "facts": {"count": 1}}]) is None


def test_healthy_cards_come_from_the_latest_card_stage_that_reported() -> None:
    assert healthy_cards(stage_rows()) == [0, 1, 2, 4, 6, 7]
    assert healthy_cards(stage_rows(link=False)) == [0, 1, 2, 4, 6, 7]
    assert healthy_cards(stage_rows()[:1]) == [0, 1, 2, 3, 4, 6, 7]
    assert healthy_cards([]) is None
    assert healthy_cards([{"stage": "device", "facts": {"healthy_cards": ["0"]}}]) is None


def test_the_service_keeps_the_healthy_cards_of_a_run(tmp_path: Path) -> None:
    def script(run: Any) -> list[dict[str, Any]]:
        events = pilot_script(IDS, refuse=())
        for event in events:
            if event.get("type") == "stage.passed" and event.get("stage") == "device":
                event["facts"] = device_facts()
            if event.get("type") == "stage.passed" and event.get("stage") == "compute":
                event["facts"] = compute_facts()
        return events

    service, notifier = make(tmp_path, script, step=5)
    run_id = submit(service, tmp_path)
    service.follower.follow(run_id, timeout=30)
    assert service.records.healthy_cards(run_id) == [0, 1, 2, 4, 6, 7]
    assert service.records.show(run_id)["healthy_cards"] == [0, 1, 2, 4, 6, 7]
    shown = notifier.latest[(run_id, "cards")]
    assert "2 bad card(s) of 8" in shown.summary


def test_preflight_diff_shows_the_card_that_changed_and_not_the_noise() -> None:
    from bot.pilot.attempts import diff_facts

    before = {"stages": {"device": {"facts": device_facts()}}}
    after_facts = device_facts()
    after_facts["cards"]["5"].update(ecc_volatile_uncorrected=0, verdict="ok", reasons=[])
    after_facts["cards"]["2"]["temperature_c"] = 71  # changes on every run: not a change
    after = {"stages": {"device": {"facts": after_facts}}}
    paths = [c.path for c in diff_facts(before, after)]
    assert "stages.device.facts.cards.5.ecc_volatile_uncorrected" in paths
    assert "stages.device.facts.cards.5.verdict" in paths
    assert not any("temperature" in p for p in paths)


def test_the_card_table_renders_in_the_terminal_and_in_slack() -> None:
    from bot.console.render import to_text
    from bot.slack.blocks import render

    message = cards_message(run_of(id="r1", name="demo"), stage_rows())
    assert message is not None
    text = to_text(message)
    assert "SLOW ⚠" in text and "0000:1b:00.0" in text and "Healthy cards" in text
    slack = render(message)
    assert "FAULT" in str(slack)


def test_a_head_stage_taken_from_its_card_proof_says_so() -> None:
    """A volume's head reuses the card stages its proof passed minutes before
    (runner/proven.py): the thread says where the figures come from."""
    from bot.messages.views import stage_detail

    row = {"stage": "compute", "state": "passed",
           "facts": {**compute_facts(), "proven_by": {"card_proof": "proof-0",
                                                      "at": "2026-12-04T04:00:00Z"}}}
    assert stage_detail(row).endswith("from this node's card proof at 2026-12-04T04:00:00Z")
    del row["facts"]["proven_by"]
    assert "card proof" not in stage_detail(row)
