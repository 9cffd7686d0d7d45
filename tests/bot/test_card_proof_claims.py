"""A node's card proof is the node's word (issue 32): its healthy cards are kept to those
its device stage saw and never more than its share of the rent (a proof claiming 10,000
cards on a share of 8 is refused, naming the node); events of the wrong shape refuse the
node by name instead of raising a bare error that left the run ``dispatching``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.card_proof import read_proof
from bot.dispatch.ray_cluster import RayNode, check_versions
from bot.dispatch.upload import SSHNode
from bot.dispatch.volume_cluster import node_cards
from bot.errors import DispatchError
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import write_manifest

NODE = SSHNode(host="10.0.0.7", workdir="/w", user="gpu")
NAME = "volume.nodes[3] (gpu@10.0.0.7:22, python python3)"


def proof(device: dict[str, Any], later: dict[str, Any] | None = None) -> str:
    events = [{"type": "stage.passed", "stage": s, "facts": {}}
              for s in ("prepare", "interpreter", "torch")]
    events.append({"type": "stage.passed", "stage": "device",
                   "facts": {"device": "cuda", **device}})
    if later is not None:
        events.append({"type": "stage.passed", "stage": "compute", "facts": later})
    return "".join(json.dumps(e) + "\n" for e in events)


def cards(n: int) -> dict[str, Any]:
    return {str(i): {"verdict": "ok", "reasons": []} for i in range(n)}


def test_a_proof_claiming_more_cards_than_its_share_is_refused_naming_the_node() -> None:
    out = proof({"cards": cards(10_000), "healthy_cards": list(range(10_000))})
    with pytest.raises(DispatchError) as caught:
        read_proof(3, NODE, True, 0, out, "", share=8)
    assert str(caught.value).startswith(f"{NAME}: the card proof offers 10000 healthy "
                                        "cards, more than the 8 rented on this node")
    assert read_proof(3, NODE, True, 0, proof({"cards": cards(8),
                                               "healthy_cards": list(range(8))}),
                      "", share=8).cards == tuple(range(8))


def test_healthy_cards_the_device_stage_never_saw_are_not_kept() -> None:
    out = proof({"cards": cards(4), "healthy_cards": [0, 1, 2, 3]},
                {"healthy_cards": [0, 1, 2, 3, 4, 5, 6, 7, 999]})
    assert read_proof(0, NODE, True, 0, out, "", share=8).cards == (0, 1, 2, 3)


@pytest.mark.parametrize("device", [
    {"cards": {"zero": {}}, "healthy_cards": [0]},
    {"count": "many", "healthy_cards": [0]},
])
def test_a_proof_of_the_wrong_shape_refuses_the_node_by_name(device: dict[str, Any]) -> None:
    with pytest.raises(DispatchError) as caught:
        read_proof(3, NODE, True, 0, proof(device), "", share=8)
    assert str(caught.value).startswith(f"{NAME}: the card proof's events cannot be read")


def test_fields_that_are_not_mappings_are_dropped_not_followed() -> None:
    out = "".join(json.dumps(e) + "\n" for e in (
        {"type": "stage.passed", "stage": "device", "facts": ["not", "a", "mapping"]},
        {"type": "stage.failed", "stage": "torch", "error": "a string"}))
    with pytest.raises(DispatchError, match=r"failed at the torch stage: None: None"):
        read_proof(3, NODE, True, 1, out, "")


def test_the_share_is_the_spec_s_node_cards() -> None:
    assert node_cards({"hardware": {"node_cards": 8}}, 10) == 8
    assert node_cards({"hardware": {"lots": 10, "cards_per_lot": 8}}, 10) == 8
    assert node_cards({}, 10) is None


class MalformedStart:
    """A dispatcher whose node answered JSON of the wrong shape, met as a bare error."""

    def start(self, handle: RunHandle) -> int | None:
        raise TypeError("'int' object is not subscriptable")

    def close(self) -> None:
        pass


def test_a_bare_error_from_a_start_never_leaves_the_run_dispatching(tmp_path: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    service = PilotService(settings, Store(settings.db_path),
                           {"local": MalformedStart()},  # type: ignore[dict-item]
                           RecordingNotifier())
    sub = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob")
    with pytest.raises(TypeError):
        service.starter.start(sub.run_id)
    run = service.store.get_run(sub.run_id)
    assert run["status"] == "dispatch_failed"
    assert run["first_error"]["type"] == "TypeError"


@pytest.mark.parametrize("printed", ['[1, 2]', '{"ray": 3, "python": "3.11.9"}',
                                     '{"ray": "2.9.0"}'])
def test_a_version_probe_of_the_wrong_shape_refuses_the_node_by_name(printed: str) -> None:
    node = RayNode("gpu@10.0.0.7:22", "10.0.0.7")
    with pytest.raises(DispatchError, match="gpu@10.0.0.7:22: its Ray and Python versions "
                                            "are not the probe's answer"):
        check_versions([node], [printed])
