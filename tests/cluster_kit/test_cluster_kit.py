"""The simulated cluster's node, through the real runner: K cards from a recorded
``nvidia-smi`` output and the torch shim (tests/cluster_kit/kit.py). The runner's card
stages run as they do on a GPU node; only the cards and their device time are simulated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.cluster_kit.kit import node_python
from tests.runner.test_stages_kit import events_of, outcomes, run_runner, write_spec

CARD_STAGES = "prepare,interpreter,torch,device,compute,interconnect"
# 4 lots of 8 H100 over 4 nodes: each node's share is 8 (runner.spec.node_share).
H100_4X8 = {"gpu": "H100", "vendor": "nvidia", "cards_per_lot": 8, "lots": 4, "nodes": 4,
            "memory_gib": 80, "bf16_tflops": 989, "fp32_tflops": 67,
            "allreduce_busbw_gbps": {"2": 360, "8": 360}}
# The simulated cards' speeds are the CPU's (the shim's matmuls and buffers are small):
# what the compute and interconnect stages measure is no card's figure, so a slow figure
# is a warning here (diagnostics.slow_card: warn), never a verdict on a card.
DIAGNOSTICS = {"timeouts": {}, "compute_size": 64, "slow_card": "warn"}


def _card_run(tmp_path: Path, cards: int, **spec: Any) -> dict[str, Any]:
    path = write_spec(tmp_path, backend="cuda", hardware=H100_4X8, diagnostics=DIAGNOSTICS,
                      **spec)
    python = node_python(tmp_path / "node" / "python", cards)
    done = run_runner(path, tmp_path / "run", "--stages", CARD_STAGES, python=str(python),
                      timeout=300)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return outcomes(events_of(tmp_path / "run"))


def test_a_node_of_eight_simulated_cards_passes_the_card_stages(tmp_path: Path) -> None:
    ends = _card_run(tmp_path, 8)
    assert {s: e.type for s, e in ends.items()} == {
        s: "stage.passed" for s in CARD_STAGES.split(",")}, ends
    device = ends["device"].data["facts"]
    assert (device["device"], device["count"], device["rented_cards"]) == ("cuda", 8, 8)
    assert device["card_source"] == "nvidia-smi"  # the recorded output, joined by UUID
    assert {c["name"] for c in device["devices"]} == {"NVIDIA H100 80GB HBM3"}
    assert [c["vendor_index"] for c in device["cards"].values()] == list(range(8))
    assert device["driver"]["driver_version"] == "550.54.15"
    assert device["healthy_cards"] == list(range(8))
    assert ends["compute"].data["facts"]["healthy_cards"] == list(range(8))
    link = ends["interconnect"].data["facts"]
    assert (link["cards"], link["library"]) == (list(range(8)), "nccl")  # gloo underneath
    assert link["healthy_cards"] == list(range(8)) and link["ranks"] == 8


def test_a_node_showing_seven_of_its_eight_cards_fails_its_device_stage(
        tmp_path: Path) -> None:
    ends = _card_run(tmp_path, 7)
    failed = ends["device"]
    assert failed.type == "stage.failed" and failed.data["error"]["type"] == "TooFewDevices"
    assert "7 card(s) visible, 8 rented on this node" in failed.data["error"]["message"]
    assert ends["compute"].type == "stage.skipped"


def test_the_recorded_bad_cards_are_left_out_of_a_volume(tmp_path: Path) -> None:
    """The recording's card 3 (ECC errors) and card 5 (degraded link): in a volume's
    spec the device stage passes on the healthy cards, its verdict kept."""
    import os

    os.environ["PREFLIGHT_SIM_FAULTS"] = "recorded"
    try:
        ends = _card_run(tmp_path, 8, volume={"gpus": True})
    finally:
        del os.environ["PREFLIGHT_SIM_FAULTS"]
    device = ends["device"]
    assert device.type == "stage.passed", device.data
    facts = device.data["facts"]
    assert facts["healthy_cards"] == [0, 1, 2, 4, 6, 7], facts
    assert facts["card_verdict"]["type"] == "CardFault"
