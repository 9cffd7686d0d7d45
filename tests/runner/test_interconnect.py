"""The interconnect stage for real: gloo all-reduces across 2 and 3 CPU processes.

Each test starts real rank processes (each imports torch: a few seconds on two shared
cores), so the cases are few and each checks several things.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from runner.collective import CollectiveError, run_allreduce
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure, StageSkipped
from runner.stages.interconnect import interconnect

pytest.importorskip("torch")


def context(tmp_path: Path, count: int, **hardware: Any) -> StageContext:
    diagnostics = {"slow_card": hardware.pop("slow_card", "fail")}
    spec = RunSpec.from_dict({"run_id": "r1", "name": "links", "inputs": {"dir": str(tmp_path)},
                              "hardware": hardware, "diagnostics": diagnostics})
    return StageContext(spec=spec, run_dir=str(tmp_path),
                        facts={"device": {"device": "cpu", "count": count}})


def test_three_processes_report_busbw_and_every_pair(tmp_path: Path) -> None:
    facts = interconnect(context(tmp_path, 3))
    assert facts["library"] == "gloo" and facts["ranks"] == 3
    assert facts["busbw_gbps"] > 0
    assert [row["size_bytes"] for row in facts["sizes"]] == [256 * 1024, 4 << 20]
    assert sorted(facts["pairs_gbps"]) == ["0-1", "0-2", "1-2"]
    assert all(v > 0 for v in facts["pairs_gbps"].values())
    assert facts["link"]["verdict"] == "no reference"
    assert facts["healthy_cards"] == [0, 1, 2]


def test_two_processes_below_the_reference_fail_naming_both_figures(tmp_path: Path) -> None:
    with pytest.raises(StageFailure) as caught:
        interconnect(context(tmp_path, 2, allreduce_busbw_gbps={"2": 1e6}))
    failure = caught.value
    assert failure.error_type == "SlowLink"
    assert "x the reference 1000000 GB/s" in failure.message
    assert failure.message.startswith("all-reduce busbw ")
    assert failure.facts["busbw_gbps"] > 0 and failure.facts["link"]["verdict"] == "slow"
    assert failure.facts["healthy_cards"] == [0, 1]  # a slow link alone blames no card
    assert "replacement node" in str(failure.hint)


def test_one_card_is_a_soft_skip(tmp_path: Path) -> None:
    with pytest.raises(StageSkipped) as caught:
        interconnect(context(tmp_path, 1))
    assert caught.value.reason == "one card" and not caught.value.blocking


def test_a_rank_that_dies_mid_collective_fails_at_once(tmp_path: Path) -> None:
    def kill_rank_one(rank: int, message: dict[str, Any], procs: list[Any]) -> None:
        if rank == 1 and message.get("event") == "ready":
            procs[1].kill()

    t0 = time.monotonic()
    with pytest.raises(CollectiveError, match=r"rank 1 \(card 1\) ended with signal 9 "
                                              r"before the all-reduce finished"):
        run_allreduce(2, cards=[0, 1], sizes=[64 << 20], iters=50, timeout_s=60,
                      on_message=kill_rank_one)
    assert time.monotonic() - t0 < 45  # not the 60 s timeout


def test_a_rank_that_hangs_is_named_after_the_timeout(tmp_path: Path) -> None:
    stopped: list[int] = []

    def freeze_rank_one(rank: int, message: dict[str, Any], procs: list[Any]) -> None:
        if rank == 1 and message.get("event") == "ready" and not stopped:
            os.kill(procs[1].pid, signal.SIGSTOP)
            stopped.append(procs[1].pid)

    # 15 s: long enough for two ranks to import torch on two busy cores, so rank 1 is
    # frozen after it joined the group, not before.
    with pytest.raises(CollectiveError, match=r"did not finish within 15 s: no answer from "
                                              r"rank 0, rank 1"):
        run_allreduce(2, sizes=[1 << 20], timeout_s=15, on_message=freeze_rank_one)
    assert stopped
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left behind
        os.kill(stopped[0], 0)
