"""The device and compute stages' per-card logic, without a GPU.

The card facts are what NVML / nvidia-smi recorded (fixtures/cards) joined with torch's
rows; the compute figures are handed in. ``FakeCudaTorch`` implements the two calls the
per-card threads make on torch (``cuda.set_device`` and the dtype attributes), so the
threading (one thread per card, a barrier, a card that raises) runs for real.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest

from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from runner.stages.cardset import join_cards, judge_cards
from runner.stages.compute_cards import judge_compute, measure_all
from runner.stages.smi import parse_nvidia_cards

FIXTURES = Path(__file__).parent / "fixtures" / "cards"
TOL = {"float32": 2e-3, "bfloat16": 2e-2}


def ctx(tmp_path: Path, *, lots: int = 8, slow_card: str = "fail",
        facts: dict[str, Any] | None = None, **hardware: Any) -> StageContext:
    spec = RunSpec.from_dict({
        "run_id": "r1", "name": "cards", "inputs": {"dir": str(tmp_path)},
        "hardware": {"gpu": "H100", "lots": lots, "cards_per_lot": 1, "bf16_tflops": 989.0,
                     **hardware},
        "diagnostics": {"slow_card": slow_card}})
    return StageContext(spec=spec, run_dir=str(tmp_path), facts=facts or {})


def recorded_cards(*, drop: int = 0) -> dict[str, dict[str, Any]]:
    vendor = parse_nvidia_cards((FIXTURES / "nvidia-smi-8xh100.csv").read_text(),
                                (FIXTURES / "nvidia-smi-remapped-rows.csv").read_text())
    seen = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": v["uuid"],
             "memory_gib": 79.1, "capability": "9.0"} for i, v in enumerate(vendor)]
    return join_cards(seen[:len(seen) - drop], vendor, None if not drop else "0,1,2,3,4,5,6")


def test_device_names_the_card_with_ecc_errors_and_keeps_the_healthy_ones(
        tmp_path: Path) -> None:
    cards = recorded_cards()
    facts: dict[str, Any] = {"warnings": []}
    with pytest.raises(StageFailure) as caught:
        judge_cards(ctx(tmp_path), cards, facts)
    failure = caught.value
    assert failure.error_type == "CardFault"
    assert failure.message == ("GPU 3 (0000:9b:00.0): 2 volatile uncorrected ECC error(s); "
                               "GPU 3 (0000:9b:00.0): 1 memory row(s) pending remap or "
                               "retirement")
    assert failure.facts["healthy_cards"] == [0, 1, 2, 4, 6, 7]  # 5: link at x4, throttled
    assert cards["5"]["verdict"] == "slow" and cards["3"]["verdict"] == "fault"
    assert cards["0"]["bus_id"] == "0000:18:00.0" and cards["0"]["vendor_index"] == 0


def test_a_slow_card_alone_is_a_warning_when_the_manifest_says_so(tmp_path: Path) -> None:
    cards = {k: v for k, v in recorded_cards().items() if k != "3"}
    facts: dict[str, Any] = {"warnings": []}
    judge_cards(ctx(tmp_path, lots=7, slow_card="warn"), cards, facts)
    assert facts["warnings"] == ["GPU 5 (0000:ba:00.0): PCIe link at x4, the card supports x16",
                                 "GPU 5 (0000:ba:00.0): clocks throttled: hw_slowdown",
                                 "GPU 5 (0000:ba:00.0): clocks throttled: hw_thermal_slowdown"]
    assert 5 not in facts["healthy_cards"]
    with pytest.raises(StageFailure, match="PCIe link at x4") as caught:
        judge_cards(ctx(tmp_path, lots=7), cards, {"warnings": []})
    assert caught.value.error_type == "SlowCard"


def test_fewer_cards_than_rented_names_both_numbers(tmp_path: Path) -> None:
    cards = recorded_cards(drop=1)  # a card fell off the bus: torch sees 7
    assert "7" not in cards and cards["6"]["bus_id"] == "0000:ca:00.0"  # joined on the UUID
    with pytest.raises(StageFailure) as caught:
        judge_cards(ctx(tmp_path, lots=4, cards_per_lot=2), cards, {"warnings": []})
    assert caught.value.error_type == "TooFewDevices"
    assert caught.value.message.startswith("7 card(s) visible, 8 rented on this node "
                                           "(4 lot(s) x 2 card(s) per lot)")
    facts: dict[str, Any] = {"warnings": []}
    healthy = {k: v for k, v in recorded_cards().items() if k not in ("3", "5")}
    judge_cards(ctx(tmp_path, lots=4), healthy, facts)
    assert facts["warnings"] == ["6 cards visible, 4 rented on this node (4 lot(s) x 1 "
                                 "card(s) per lot): the extra cards are not yours to bill or "
                                 "to use"]


def figures(bf16: dict[int, float], **over: Any) -> dict[int, dict[str, Any]]:
    return {i: {"check": {"float32": 1e-4, "bfloat16": 1e-3}, "bf16_tflops": v,
                "fp32_tflops": 50.0, **over.get(str(i), {})} for i, v in bf16.items()}


def device_facts() -> dict[str, Any]:
    cards = {str(i): {"bus_id": f"0000:{0x18 + 0x10 * i:02x}:00.0"} for i in range(4)}
    return {"device": {"cards": cards, "healthy_cards": [0, 1, 2, 3]}}


def test_compute_names_the_slow_card_against_its_peers(tmp_path: Path) -> None:
    results = figures({0: 790.0, 1: 795.0, 2: 785.0, 3: 412.0})
    facts: dict[str, Any] = {}
    with pytest.raises(StageFailure) as caught:
        judge_compute(ctx(tmp_path, facts=device_facts()), results, TOL, facts)
    assert caught.value.error_type == "SlowCard"
    assert caught.value.message == ("GPU 3 (0000:48:00.0): bf16 matmul 412 TFLOP/s, 0.52x "
                                    "its peers' median 790")
    assert facts["cards"]["0"]["bf16_fraction_of_peak"] == round(790 / 989, 4)
    assert facts["healthy_cards"] == [0, 1, 2]
    assert facts["bf16_tflops"] == 787.5  # the median of every card without a fault
    assert facts["bf16_fraction_of_peak"] == round(787.5 / 989, 4)


def test_compute_wrong_result_and_nan_fail_naming_the_cards(tmp_path: Path) -> None:
    results = figures({0: 790.0, 1: 790.0, 2: 790.0, 3: math.nan},
                      **{"1": {"check": {"float32": 0.3, "bfloat16": 1e-3}}})
    facts: dict[str, Any] = {}
    with pytest.raises(StageFailure) as caught:
        judge_compute(ctx(tmp_path, facts=device_facts(), slow_card="warn"), results, TOL, facts)
    assert caught.value.error_type == "WrongResult"
    assert caught.value.message.startswith("GPU 1 (0000:28:00.0): float32 matmul differs")
    assert "GPU 3 (0000:48:00.0): bf16 matmul gave no usable figure (nan)" in \
        caught.value.message
    assert facts["cards"]["3"]["verdict"] == "fault"
    assert facts["healthy_cards"] == [0, 2]


def test_all_cards_slow_are_caught_by_the_floor_and_fail_even_with_warn(tmp_path: Path) -> None:
    results = figures({0: 300.0, 1: 305.0})
    facts: dict[str, Any] = {}
    with pytest.raises(StageFailure) as caught:  # no healthy card left (issue #23)
        judge_compute(ctx(tmp_path, slow_card="warn", bf16_floor_tflops=500.0,
                          facts={"device": {}}), results, TOL, facts)
    assert caught.value.error_type == "NoHealthyCard" and facts["healthy_cards"] == []
    assert "below this model's floor of 500 TFLOP/s" in caught.value.message


class FakeCuda:
    def __init__(self) -> None:
        self.current: dict[int, int] = {}

    def set_device(self, index: int) -> None:
        self.current[threading.get_ident()] = index


class FakeCudaTorch:
    float32, bfloat16, float16 = "float32", "bfloat16", "float16"

    def __init__(self) -> None:
        self.cuda = FakeCuda()


def test_every_card_runs_in_its_own_thread_and_a_raising_card_does_not_hang() -> None:
    torch = FakeCudaTorch()
    timed_together = threading.Barrier(3, timeout=10)  # the three good cards overlap

    def error_of(t: Any, dev: str, dtype: str, n: int) -> float:
        if dev == "cuda:2":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return 1e-4

    def timed(t: Any, dev: str, dtype: str, n: int, on_gpu: bool) -> tuple[float, int]:
        assert t.cuda.current[threading.get_ident()] == int(dev.split(":")[1])
        if dtype == "bfloat16":
            timed_together.wait()
        return 700.0 + int(dev.split(":")[1]), 10

    results = measure_all(torch, [0, 1, 2, 3], 8, 16, ["float32", "bfloat16"], error_of, timed)
    assert results[2]["error"].startswith("RuntimeError: CUDA error: an illegal memory")
    assert [results[i]["bf16_tflops"] for i in (0, 1, 3)] == [700.0, 701.0, 703.0]


class FakeMemoryCuda:
    """torch.cuda's memory queries for three cards, the last one gone from the bus."""

    def device_count(self) -> int:
        return 3

    def mem_get_info(self, index: int) -> tuple[int, int]:
        if index == 2:
            raise RuntimeError("CUDA error: unspecified launch failure")
        return (100 - 10 * index) * 2 ** 30, 141 * 2 ** 30


def test_memory_lists_every_cards_free_memory() -> None:
    from types import SimpleNamespace

    from runner.stages.memory import cards_free

    out = cards_free(SimpleNamespace(cuda=FakeMemoryCuda()))
    assert out["0"] == {"free_gib": 100.0, "total_gib": 141.0}
    assert out["1"]["free_gib"] == 90.0
    assert out["2"]["error"].startswith("RuntimeError: CUDA error")
