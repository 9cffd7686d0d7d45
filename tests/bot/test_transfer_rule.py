"""When a copy to or from a node has failed (bot/nodes/ssh/transfer.py): a rule on its
progress, not a fixed wall limit. A fake clock: no sleeping, no timing assertions."""

from __future__ import annotations

from pathlib import Path

from bot.nodes.registry import make_dispatchers
from bot.nodes.ssh.transfer import MIB, TransferLimits, TransferWatch
from bot.settings import Settings

GB = 10 ** 9


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_200_gb_upload_that_keeps_moving_runs_past_the_old_900_s_limit() -> None:
    clock = Clock()
    watch = TransferWatch(TransferLimits(), fixed_s=900.0, clock=clock)
    meter = watch.meter("gpu@10.0.0.7:22", "upload to volume.nodes[3]")
    meter.start(200 * GB)
    for _second in range(4000):  # 50 MB/s: 4,000 s, every second judged
        clock.now += 1.0
        meter.moved(50 * 10 ** 6)
        assert watch.verdict() is None
    assert meter.done == 200 * GB and clock.now - watch.t0 > 900
    assert watch.ceiling() == 900.0 + 200 * GB / MIB  # 900 s + its bytes at 1 MiB/s


def test_a_transfer_that_stops_moving_fails_after_the_stall_limit_naming_it() -> None:
    clock = Clock()
    watch = TransferWatch(TransferLimits(stall_s=120.0), fixed_s=900.0, clock=clock)
    meter = watch.meter("gpu@10.0.0.7:22", "upload to volume.nodes[3]")
    meter.start(64 * MIB)
    clock.now += 5.0
    meter.moved(3 * MIB)
    clock.now += 120.0
    assert watch.verdict() is None  # exactly the limit: not yet
    clock.now += 1.0
    assert watch.verdict() == (
        "gpu@10.0.0.7:22: the upload to volume.nodes[3] stalled: no byte moved for 121 s "
        "(3.0 MiB of 64.0 MiB moved; the stall limit is 120 s, "
        "PREFLIGHT_TRANSFER_STALL_S). Check the node's disk and the network, then try again")


def test_a_step_that_moves_no_bytes_is_no_stall_and_the_ceiling_still_bounds_it() -> None:
    """Before its stream and after it (the node hashing its copy, then its answer) a
    node moves no bytes: only the ceiling bounds those steps."""
    clock = Clock()
    watch = TransferWatch(TransferLimits(stall_s=120.0), fixed_s=900.0, clock=clock)
    meter = watch.meter("n1:22", "upload to volume.nodes[1]")
    clock.now += 600.0  # hashing, not started
    assert watch.verdict() is None
    meter.start(10)
    meter.moved(10)
    meter.end()
    clock.now += 299.0  # waiting for the node's answer
    assert watch.verdict() is None
    clock.now += 2.0
    assert (watch.verdict() or "").startswith(
        "the copy took more than 900 s, its ceiling (900 s + 10 bytes at the floor rate of "
        "1.0 MiB/s, PREFLIGHT_TRANSFER_FLOOR_BYTES_PER_S): n1:22 upload to volume.nodes[1]: "
        "10 bytes of 10 bytes")


def test_a_trickle_fails_at_the_ceiling_of_its_bytes_at_the_floor_rate() -> None:
    clock = Clock()
    limits = TransferLimits(stall_s=120.0, floor_bytes_per_s=1000.0)
    watch = TransferWatch(limits, fixed_s=100.0, clock=clock)
    meter = watch.meter("n:22", "results fetch")
    meter.start()
    meter.expect(50_000)  # a fetch learns its sizes as it lists them: 50 s at the floor
    verdicts = []
    while not verdicts:
        clock.now += 60.0
        meter.moved(1)  # a byte a minute: never a stall
        verdicts = [v for v in [watch.verdict()] if v]
    assert clock.now - watch.t0 == 180.0  # the first look past 100 + 50 s
    assert "the copy took more than 150 s" in verdicts[0]


def test_several_nodes_at_once_fail_on_the_one_that_stalls() -> None:
    clock = Clock()
    watch = TransferWatch(TransferLimits(stall_s=10.0), fixed_s=900.0, clock=clock)
    moving, stuck = (watch.meter(f"n{i}:22", f"upload to volume.nodes[{i}]") for i in (0, 1))
    moving.start(100 * MIB)
    stuck.start(100 * MIB)
    for _ in range(11):
        clock.now += 1.0
        moving.moved(MIB)
    assert (watch.verdict() or "").startswith(
        "n1:22: the upload to volume.nodes[1] stalled: no byte moved for 11 s (0 bytes of "
        "100.0 MiB moved")
    assert watch.ceiling() == 900.0 + 200.0  # the sum of their bytes: one uplink


def test_the_stall_limit_and_floor_rate_come_from_the_settings(tmp_path: Path) -> None:
    default = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    assert (default.transfer_stall_s, default.transfer_floor_bytes_per_s) == (120.0, MIB)
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path),
                                  "PREFLIGHT_TRANSFER_STALL_S": "30",
                                  "PREFLIGHT_TRANSFER_FLOOR_BYTES_PER_S": "5000000"})
    ssh = make_dispatchers(settings)["ssh"]
    try:
        assert ssh.transfer_limits == TransferLimits(  # type: ignore[attr-defined]
            stall_s=30.0, floor_bytes_per_s=5e6)
    finally:
        ssh.close()


def test_the_ceiling_counts_files_as_well_as_bytes() -> None:
    """A fetch of many small files is allowed their number, not only their bytes."""
    clock = Clock()
    watch = TransferWatch(TransferLimits(per_file_s=0.01), fixed_s=900.0, clock=clock)
    meter = watch.meter("gpu@10.0.0.7:22", "results fetch")
    meter.start()
    for _ in range(1000):
        meter.expect(100, files=1)
    assert watch.files == 1000
    assert watch.ceiling() == 900.0 + 100_000 / MIB + 10.0
    clock.now += watch.ceiling() + 1
    meter.moved(1)
    verdict = watch.verdict()
    assert verdict is not None and "+ 1000 files at 0.01 s each" in verdict
