"""The forecast's phases around the items (issue 36, point 2): node preparation in its
real waves, the upload at the pilot's measured rate, the rework the pilot's refusals
predict, the output collection, evidence and fetch from the pilot's own rates."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from bot.dispatch import ray_cluster
from bot.nodes.ssh import dispatcher
from bot.pilot import forecast_setup
from bot.pilot.forecast import Setup, forecast
from bot.pilot.forecast_rework import HANG_TIMEOUTS
from tests.bot.test_forecast_calibrated import cal, inputs


def ssh(**kw: Any) -> Setup:
    return Setup(**{"dispatch_s": 3.0, "ssh": True, **kw})


def test_the_bounds_the_setup_counts_are_the_dispatchers_own() -> None:
    assert forecast_setup.PREPARE_AT_ONCE == dispatcher.PREPARE_AT_ONCE
    assert forecast_setup.RAY_START_AT_ONCE == ray_cluster.RAY_START_AT_ONCE


def test_node_preparation_runs_in_waves_of_the_dispatchers_bound() -> None:
    # 10 SSH nodes: copies 4 at a time = 3 waves, each the pilot's measured dispatch
    fc = forecast(inputs(nodes=10, rented_cards=10, lots=10, setup=ssh()))
    assert fc.numbers["setup_dispatch_s"] == 9.0
    assert "× 3 waves: the 10 nodes' copies are made 4 at a time" in \
        fc.figure("setup_dispatch").formula
    one = forecast(inputs(setup=ssh()))
    assert one.numbers["setup_dispatch_s"] == 3.0
    assert "waves" not in one.figure("setup_dispatch").formula


def test_the_upload_goes_at_the_pilots_measured_rate_when_it_sent_enough() -> None:
    # the pilot sent 20 MB in its 2 s dispatch: 10 MB/s; 10 MB of inputs × 2 nodes
    fc = forecast(inputs(nodes=2, rented_cards=2, lots=2,
                         setup=ssh(dispatch_s=2.0, uploaded_bytes=20_000_000)))
    assert fc.numbers["setup_upload_s"] == pytest.approx(2.0)
    assert "(the pilot's upload: 20,000,000 B in its 2 s dispatch, measured)" in \
        fc.figure("setup_upload").formula
    little = forecast(inputs(setup=ssh(uploaded_bytes=4096)))
    assert "estimated: the pilot sent too little to measure it" in \
        little.figure("setup_upload").formula
    assert little.numbers["setup_upload_s"] == pytest.approx(10_000_000 / 50e6)


def test_inputs_that_hung_in_the_pilot_add_their_rework_at_its_rate() -> None:
    base = forecast(inputs())
    fc = forecast(inputs(pilot_items=12, pilot_refused=3, pilot_timed_out=1,
                         item_timeout_s=5.0))
    n = fc.numbers
    t = n["batch_s"]
    # 1 of 12 hung: 10,000 ÷ 12 inputs × (2 × 5 s + a batch) ÷ 2 workers
    expected = 10_000 / 12 * (HANG_TIMEOUTS * 5.0 + t) / 2
    assert n["rework_hangs_s"] == pytest.approx(expected, abs=1e-3)
    for k in ("low", "mid", "high"):
        assert n[f"proc_{k}_s"] == pytest.approx(base.numbers[f"proc_{k}_s"] + expected,
                                                 abs=1e-2)
    formula = fc.figure("rework_hangs").formula
    assert "1 of the pilot's 12 inputs hung" in formula
    assert "2 refusals the handler returned: no rework" in formula
    assert "item timeout: task.item_timeout_s" in formula
    assert "the rework of inputs that hang" in fc.figure("processing").formula


def test_refusals_the_handler_returned_cost_no_rework_and_say_so() -> None:
    fc = forecast(inputs(pilot_items=12, pilot_refused=2))
    assert fc.figure("rework_hangs").value == "0 s"
    assert "no rework (their time is in the measured batches)" in \
        fc.figure("rework_hangs").formula
    assert fc.numbers["proc_mid_s"] == forecast(inputs()).numbers["proc_mid_s"]
    assert all(f.key != "rework_hangs" for f in forecast(inputs(pilot_items=12)).figures)


def test_evidence_fetch_and_collection_scale_the_pilots_own_rates() -> None:
    # the pilot's evidence: 10 files, 1 MB in 0.5 s; its fetch: 20 files, 2 MB in 2 s;
    # the calibration wrote 128 output files, 1.28 MB for 128 items: 1 file, 10 kB an item
    c = replace(cal(), output_files=128, output_bytes=1_280_000)
    fc = forecast(inputs(calibration=c, nodes=2, rented_cards=2, lots=2, pilot_items=12,
                         evidence=(0.5, 10, 1_000_000), fetch=(2.0, 20, 2_000_000),
                         setup=ssh()))
    n = fc.numbers
    files_v, bytes_v = 10 + 10_000, 1_000_000 + 100_000_000
    assert n["evidence_s"] == pytest.approx(max(files_v * 0.05, bytes_v * 5e-7), abs=1e-3)
    assert n["fetch_s"] == pytest.approx(max(files_v * 0.1, bytes_v * 1e-6), abs=1e-3)
    # half the outputs were written on the other node: collected at the fetch's rates
    assert n["collection_s"] == pytest.approx(max(5_000 * 0.1, 50_000_000 * 1e-6), abs=1e-3)
    assert n["after_s"] == pytest.approx(n["evidence_s"] + n["fetch_s"] + n["collection_s"],
                                         abs=1e-2)
    assert "the pilot's own fetch: 20 files, 2,000,000 B in 2 s" in fc.figure("fetch").formula
    assert "the outputs of the 1 other node (1 ÷ 2 of them)" in \
        fc.figure("collection").formula
    assert "estimated: no collection measured, the pilot's own fetch" in \
        fc.figure("collection").formula
    assert "after the items (collection, evidence, fetch)" in fc.figure("wall").formula
    assert n["mid_s"] == pytest.approx(n["setup_s"] + n["proc_mid_s"] + n["after_s"],
                                       abs=1e-2)


def test_outputs_left_on_the_nodes_are_not_collected_and_a_local_head_fetches_nothing() -> None:
    kept = forecast(inputs(nodes=2, rented_cards=2, lots=2, pilot_items=12,
                           evidence=(0.5, 10, 1_000_000), outputs_on_nodes=True,
                           setup=ssh()))
    assert kept.numbers["collection_s"] == 0.0
    assert "volume.outputs_on_nodes" in kept.figure("collection").formula
    assert "estimated: the pilot's fetch was not measured" in kept.figure("fetch").formula
    local = forecast(inputs(pilot_items=12, evidence=(0.5, 10, 1_000_000)))
    assert "fetch_s" not in local.numbers and "collection_s" not in local.numbers


def test_the_pilots_upload_and_fetch_are_read_from_its_layout_record(tmp_path: Any) -> None:
    from bot.service.forecast_inputs import pilot_transfers

    assert pilot_transfers(tmp_path) == (None, None)
    (tmp_path / "remote.json").write_text(
        '{"uploaded": {"runner": 1000, "project": 24000000}, '
        '"fetched": {"seconds": 2.5, "files": 31, "bytes": 4096}}')
    assert pilot_transfers(tmp_path) == (24_001_000, (2.5, 31, 4096))
    # a node's record is untrusted: what is not a number is dropped, nothing raises
    (tmp_path / "remote.json").write_text(
        '{"uploaded": {"runner": "x", "project": -5}, "fetched": {"seconds": "2"}}')
    assert pilot_transfers(tmp_path) == (0, None)
    (tmp_path / "remote.json").write_text("[1, 2")
    assert pilot_transfers(tmp_path) == (None, None)


def test_a_sample_drawn_on_the_bot_host_is_said_in_the_calibration_figure() -> None:
    from bot.pilot.calibration import calibration_of

    row = {"stage": "calibrate", "state": "passed",
           "started_at": "2026-12-03T12:00:00+00:00", "ended_at": "2026-12-03T12:00:15+00:00",
           "facts": {"batch_size": 16, "workers": 2, "listed": 10_000,
                     "drawn_on": "the bot host", "sample_sent": 672,
                     "batches": [{"items": 16, "bytes": 16_000, "seconds": t}
                                 for t in (0.5, 0.52, 0.48)]}}
    got = calibration_of([row])
    assert got is not None and (got.drawn_on, got.sample_sent) == ("the bot host", 672)
    fc = forecast(inputs(calibration=got))
    assert "drawn at random from the volume's 10,000 on the bot host and sent with the " \
        "pilot (672 inputs: the node does not hold the corpus), on 2 workers of the " \
        "pilot's node" in fc.figure("calibration").formula
    bad = calibration_of([{**row, "facts": {**row["facts"], "drawn_on": ["x"]}}])
    assert bad is not None and bad.drawn_on is None


def test_a_measured_collect_stage_sets_the_collections_rate_and_is_no_setup() -> None:
    # the run's own collect stage: 40 files, 8 MB in 4 s (0.1 s a file, 0.5 s/MB)
    c = replace(cal(), output_files=128, output_bytes=1_280_000)
    fc = forecast(inputs(calibration=c, nodes=2, rented_cards=2, lots=2, pilot_items=12,
                         evidence=(0.5, 10, 1_000_000), fetch=(2.0, 20, 2_000_000),
                         collect=(4.0, 40, 8_000_000), setup=ssh()))
    assert fc.numbers["collection_s"] == pytest.approx(max(5_000 * 0.1, 50_000_000 * 5e-7),
                                                       abs=1e-3)
    formula = fc.figure("collection").formula
    assert "the run's own collect stage, measured: 40 files, 8,000,000 B in 4 s" in formula
    assert "estimated" not in formula


def test_the_collect_stages_seconds_and_sizes_are_read_from_its_row() -> None:
    from bot.service.forecast_inputs import _collected, measured_setup
    from tests.bot.runs import run_of

    row = {"stage": "collect", "state": "passed", "started_at": "2026-01-01T00:00:00Z",
           "ended_at": "2026-01-01T00:00:06Z", "facts": {"files": 3, "bytes": 900}}
    proof = {"stage": "device", "state": "passed", "started_at": "2026-01-01T00:00:00Z",
             "ended_at": "2026-01-01T00:00:02Z", "facts": {}}
    assert _collected([proof, row]) == (6.0, 3, 900)
    assert _collected([{**row, "state": "failed"}]) is None
    assert _collected([{**row, "facts": {"files": "3", "bytes": True}}]) is None
    # the collection runs after the items: not part of the setup the pilot measured
    setup = measured_setup(run_of(id="r-c1", name="demo", attempt=1), [proof, row], None, {})
    assert setup.diagnostics_s == 2.0
