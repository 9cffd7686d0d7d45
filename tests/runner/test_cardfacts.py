"""Card facts from NVML, nvidia-smi, amd-smi and the kernel log, on recorded outputs.

The fixtures in fixtures/cards/ are written in the public formats of each tool: an
eight-card H100 node where GPU 3 (0000:9b:00.0) has uncorrected ECC errors, a row pending
remap and Xid 48/63 in the kernel log, and GPU 5 (0000:ba:00.0) trained its PCIe link at
x4 gen 1 and is thermally throttled.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runner import cards
from runner.stages import nvml, smi

FIXTURES = Path(__file__).parent / "fixtures" / "cards"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_nvidia_smi_rows_with_ecc_errors_and_a_downgraded_link() -> None:
    rows = smi.parse_nvidia_cards(fixture("nvidia-smi-8xh100.csv"),
                                  fixture("nvidia-smi-remapped-rows.csv"))
    assert [r["index"] for r in rows] == list(range(8))
    bad = rows[3]
    assert bad["bus_id"] == "0000:9b:00.0" and bad["capability"] == "9.0"
    assert bad["ecc_volatile_uncorrected"] == 2 and bad["rows_pending"] == 1
    assert bad["row_remap_failure"] is False
    assert bad["memory_mib"] == 81559 and bad["name"] == "NVIDIA H100 80GB HBM3"
    link = rows[5]
    assert link["pcie"] == {"gen_current": 1, "gen_max": 5, "width_current": 4,
                            "width_max": 16}
    assert link["throttle_reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert rows[0]["throttle_reasons"] == []  # idle is not a throttle
    # [N/A] cells (ECC off on card 6) are unknown, not zero and not an error.
    assert rows[6]["ecc_volatile_uncorrected"] is None
    assert rows[6]["rows_pending"] == 0  # the remapped-rows query knows better
    assert smi.parse_nvidia_cards(fixture("nvidia-smi-8xh100.csv"))[6]["rows_pending"] is None
    verdicts = {r["index"]: cards.judge_health(r) for r in rows}
    assert [i for i, v in verdicts.items() if v[0]] == [3]
    assert [i for i, v in verdicts.items() if v[1]] == [5]


def test_a_real_h200_s_nvidia_smi_rows() -> None:
    """Recorded on a rented H200 (2026-12-04, driver 580.159.04) with the runner's own
    queries: an idle card (throttle 0x1 is idle, not a throttle), ECC on, no pending rows."""
    [row] = smi.parse_nvidia_cards(fixture("nvidia-smi-1xh200-real.csv"),
                                   fixture("nvidia-smi-remapped-rows-1xh200-real.csv"))
    assert (row["index"], row["name"], row["bus_id"], row["capability"]) == (
        0, "NVIDIA H200", "0000:00:06.0", "9.0")
    assert (row["memory_mib"], row["memory_free_mib"]) == (143771, 143156)
    assert row["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 16,
                           "width_max": 16}
    assert row["throttle_reasons"] == [] and row["ecc_volatile_uncorrected"] == 0
    assert (row["rows_pending"], row["row_remap_failure"]) == (0, False)
    assert cards.judge_health(row) == ([], [], [])  # no fault, no slowness, no note


def test_malformed_smi_lines_are_skipped_not_fatal() -> None:
    assert smi.parse_nvidia_cards("garbage\n1, 2, 3\n\n") == []
    assert smi.parse_nvidia_remap("x") == {}
    assert smi.throttle_names("not hex") == []


def test_xid_errors_are_attached_to_their_card() -> None:
    rows = smi.parse_nvidia_cards(fixture("nvidia-smi-8xh100.csv"))
    smi.attach_xid(rows, smi.parse_xid(fixture("dmesg-xid.txt")))
    assert [x["code"] for x in rows[3]["xid"]] == [48, 63]
    assert [x["code"] for x in rows[5]["xid"]] == [74]
    assert rows[0]["xid"] == []
    notes = cards.judge_health(rows[3])[2]
    assert "Xid 48 in the kernel log (double-bit ECC error)" in notes


class FakeNvml:
    """The part of pynvml's API the stage calls, answering from one recorded card."""

    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    def __init__(self, recorded: list[dict[str, Any]]) -> None:
        self.recorded = recorded

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's names
        return len(self.recorded)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:  # noqa: N802
        return self.recorded[index]

    def __getattr__(self, name: str) -> Any:
        def query(handle: dict[str, Any], *args: Any) -> Any:
            value = handle[name]
            if isinstance(value, Exception):
                raise value
            return value
        return query


class NVMLError_NotSupported(Exception):  # noqa: N801 - pynvml's name
    pass


def recorded_h200(**over: Any) -> dict[str, Any]:
    card = {
        "nvmlDeviceGetUUID": "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
        "nvmlDeviceGetName": b"NVIDIA H200",  # bytes, as older nvidia-ml-py returns
        "nvmlDeviceGetPciInfo": SimpleNamespace(busId=b"00000000:19:00.0"),
        "nvmlDeviceGetMemoryInfo": SimpleNamespace(total=150754820096, free=150140026880),
        "nvmlDeviceGetCudaComputeCapability": (9, 0),
        "nvmlDeviceGetCurrPcieLinkGeneration": 5, "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16, "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetTemperature": 31,
        "nvmlDeviceGetCurrentClocksEventReasons": NVMLError_NotSupported(),
        "nvmlDeviceGetCurrentClocksThrottleReasons": 0x1,
        "nvmlDeviceGetTotalEccErrors": 0,
        "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
        "nvmlDeviceGetRetiredPagesPendingStatus": 0,
    }
    card.update(over)
    return card


def test_nvml_rows_from_a_recorded_card_and_a_sick_one() -> None:
    sick = recorded_h200(nvmlDeviceGetTotalEccErrors=4,
                         nvmlDeviceGetRemappedRows=(0, 2, 1, 0),
                         nvmlDeviceGetCurrPcieLinkWidth=8,
                         nvmlDeviceGetPciInfo=SimpleNamespace(busId="00000000:3B:00.0"))
    rows = nvml.read_cards(FakeNvml([recorded_h200(), sick]))
    good = rows[0]
    assert good["name"] == "NVIDIA H200" and good["bus_id"] == "0000:19:00.0"
    assert good["memory_mib"] == 143771 and good["capability"] == "9.0"
    assert good["rows_pending"] == 0 and good["throttle_reasons"] == []
    assert cards.judge_health(good) == ([], [], [])
    faults, slow, _ = cards.judge_health(rows[1])
    assert faults == ["4 volatile uncorrected ECC error(s)",
                      "1 memory row(s) pending remap or retirement"]
    assert slow == ["PCIe link at x8, the card supports x16"]


def test_nvml_query_a_card_does_not_support_is_unknown() -> None:
    card = recorded_h200(nvmlDeviceGetTotalEccErrors=NVMLError_NotSupported(),
                         nvmlDeviceGetRemappedRows=NVMLError_NotSupported(),
                         nvmlDeviceGetRetiredPagesPendingStatus=1)
    row = nvml.read_cards(FakeNvml([card]))[0]
    assert row["ecc_volatile_uncorrected"] is None and row["rows_pending"] == 1


def test_amd_smi_rows() -> None:
    rows = smi.parse_amd_cards(fixture("amd-smi-static.json"), fixture("amd-smi-metric.json"))
    assert [r["bus_id"] for r in rows] == ["0000:0c:00.0", "0000:22:00.0"]
    assert rows[0]["gfx_arch"] == "gfx942" and rows[0]["memory_mib"] == 196592
    assert rows[1]["memory_mib"] == 196592 and rows[1]["temperature_c"] == 44
    assert rows[1]["pcie"] == {"gen_current": 4, "gen_max": 5, "width_current": 8,
                               "width_max": 16}
    assert rows[1]["ecc_volatile_uncorrected"] == 3
    assert smi.parse_amd_cards("not json") == []


def fake_tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_card_facts_falls_back_to_nvidia_smi_and_says_so(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import pynvml  # noqa: F401
        pytest.skip("pynvml is installed here: the fallback is not reachable")
    except ImportError:
        pass
    fake_tool(tmp_path, "nvidia-smi", f"""case "$1" in
  --query-remapped-rows=*) cat {FIXTURES / 'nvidia-smi-remapped-rows.csv'} ;;
  --query-gpu=*) cat {FIXTURES / 'nvidia-smi-8xh100.csv'} ;;
  *) exit 9 ;;
esac
""")
    fake_tool(tmp_path, "dmesg", f"cat {FIXTURES / 'dmesg-xid.txt'}\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    facts = smi.card_facts("cuda")
    assert facts["source"] == "nvidia-smi" and "not importable" in facts["nvml"]
    assert facts["xid_source"] == "dmesg"
    assert len(facts["cards"]) == 8 and facts["cards"][3]["rows_pending"] == 1
    assert [x["code"] for x in facts["cards"][3]["xid"]] == [48, 63]


def test_rocm_smi_rows_when_amd_smi_is_absent() -> None:
    rows = smi.parse_rocm_smi_cards(fixture("rocm-smi-cards.json"))
    assert [r["index"] for r in rows] == [0, 1]
    assert rows[0]["bus_id"] == "0000:0c:00.0" and rows[0]["gfx_arch"] == "gfx942"
    assert rows[0]["memory_mib"] == 196592 and rows[0]["name"] == "AMD Instinct MI300X"
    assert rows[1]["temperature_c"] == 41 and rows[1]["ecc_volatile_uncorrected"] is None
    assert smi.parse_rocm_smi_cards("[]") == [] and smi.parse_rocm_smi_cards("{") == []
