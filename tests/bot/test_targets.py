"""What an approval will spend on (bot.messages.targets), shown before the volume starts."""

from __future__ import annotations

from typing import Any

from bot.messages import views
from bot.messages.model import Fields
from bot.messages.targets import spend_lines, spend_pairs
from bot.pilot.record import Run
from tests.bot.manifest_helpers import merged
from tests.bot.runs import run_of

PLAN = {"gpu": "H100", "lots": 2, "cards_per_lot": 8, "total_cards": 16, "days": 7,
        "total_usd": "1400.00"}


def run_with(manifest: dict[str, Any]) -> Run:
    if isinstance(manifest.get("volume"), dict):  # a volume needs its inputs to be one
        manifest = {**manifest, "volume": {"inputs": {"dir": "c", "expected_count": 3},
                                           **manifest["volume"]}}
    return run_of(id="run-1", name="demo", kind="pilot", status="awaiting_decision",
                  plan=PLAN, manifest_json=merged(**manifest))


def test_the_volume_nodes_cards_and_hosts_an_approval_spends_on() -> None:
    nodes = [{"kind": "ssh", "host": "gpu-1.example", "port": 22, "user": "gpu"},
             {"kind": "ssh", "host": "gpu-2.example", "port": 2222}]
    pairs = dict(spend_pairs(run_with({"node": nodes[0], "volume": {"nodes": nodes}})))
    assert pairs["Volume nodes"] == ("volume.nodes[0]: ssh gpu@gpu-1.example:22; "
                                     "volume.nodes[1]: ssh gpu-2.example:2222")
    assert pairs["Cards"] == "16 card(s) (2 H100 lot(s) x 8) for 7 day(s), 1400.00 USD"
    assert pairs["Hosts"] == "gpu-1.example, gpu-2.example"
    # No volume.nodes: the pilot's node; the bot host named as such.
    local = dict(spend_pairs(run_with({"node": {"kind": "local"}, "volume": {"nodes": None}})))
    assert local["Volume nodes"] == "node: local (the bot host itself)"
    assert local["Hosts"] == "the bot host"
    assert spend_pairs(run_with({"node": {"kind": "local"}})) == []  # no volume: nothing
    assert spend_lines(run_with({"volume": {"nodes": nodes}}))[2] == (
        "Hosts: gpu-1.example, gpu-2.example")


def test_the_decision_message_shows_them_beside_the_buttons() -> None:
    run = run_with({"volume": {"nodes": [{"kind": "local"}]}})
    message = views.decision_message(run, [])
    fields = [b for b in message.blocks if isinstance(b, Fields)]
    assert fields and dict(fields[0].pairs)["Hosts"] == "the bot host"
    plain = views.decision_message(run_with({}), [])
    assert not [b for b in plain.blocks if isinstance(b, Fields)]
