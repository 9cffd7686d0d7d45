"""The results fetch's caps sized per run (bot/pilot/fetch_caps.py) and shown in the plan:
the files a run's fetch may bring follow from its inputs, its bytes from the evidence its
pilot's forecast expects (× 2), never above the bot host's settings; a volume whose
expected evidence passes them is told so in the forecast, before the approval."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bot.messages.views import plan_message
from bot.pilot.fetch_caps import (
    BYTES_FLOOR,
    FILES_BASE,
    FILES_PER_INPUT,
    HEADROOM,
    FetchCaps,
    caps_of,
    over_ceiling,
    sized_bytes,
    volume_caps,
    with_fetch_caps,
)
from bot.pilot.forecast import forecast
from bot.pilot.plan import Plan, make_plan
from bot.pilot.specbuild import build_spec
from bot.settings import Settings
from runner.spec import RunSpec
from tests.bot.manifest_helpers import dump, load, make_project, merged
from tests.bot.runs import run_of
from tests.bot.test_forecast_calibrated import cal
from tests.bot.test_forecast_calibrated import inputs as forecast_inputs
from tests.bot.test_forecast_phases import ssh


def test_the_files_cap_follows_the_inputs_under_the_settings_bound() -> None:
    bound = caps_of(Settings.from_env({"PREFLIGHT_FETCH_MAX_FILES": "50000",
                                       "PREFLIGHT_FETCH_MAX_BYTES": str(8 << 30)}))
    assert bound == FetchCaps(total_bytes=8 << 30, file_bytes=2 << 30, files=50_000)
    assert bound.for_inputs(12).files == FILES_BASE + FILES_PER_INPUT * 12
    assert bound.for_inputs(1_000_000).files == 50_000  # the bot host's bound holds
    assert bound.for_inputs(0) == bound  # unknown: the bounds as they are
    assert bound.for_inputs(12).total_bytes == 8 << 30


def test_the_plan_shows_the_caps_for_the_pilot_and_the_volume(tmp_path: Path) -> None:
    make_project(tmp_path)
    inputs = {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": 12}
    loaded = load(tmp_path, dump(merged(volume={"inputs": inputs})))
    caps = caps_of(Settings.from_env({"PREFLIGHT_FETCH_MAX_FILES": "1030"}))  # under 1,048
    plan = make_plan(loaded, caps=caps)
    assert plan.fetch == (
        "pilot: up to 1,030 files, 4.00 GiB in all, "
        "2.00 GiB per file; volume: up to 1,030 files, 4.00 GiB in all, 2.00 GiB per file "
        "(at most: its bytes are sized after the pilot, from its evidence copy)")
    assert Plan.from_dict(plan.to_dict()).fetch == plan.fetch
    shown = plan_message(run_of(id="r-a1", name="demo", attempt=1, plan=plan.to_dict()))
    pairs = dict(next(b.pairs for b in shown.blocks if hasattr(b, "pairs")))
    assert pairs["Results fetch (caps)"] == plan.fetch


MIB = 1 << 20


def pilot_forecast(per_input: int) -> dict[str, object]:
    """A pilot's stored forecast over SSH: its evidence copy held 10 files, 1,000 bytes;
    its calibration wrote one output file of ``per_input`` bytes an input; the volume:
    10,000 inputs, so 1,000 + 10,000 × ``per_input`` bytes of evidence expected."""
    c = replace(cal(), output_files=128, output_bytes=128 * per_input)
    return forecast(forecast_inputs(calibration=c, pilot_items=12, evidence=(0.5, 10, 1_000),
                                    fetch=(1.0, 10, 1_000), setup=ssh())).to_dict()


def test_a_volumes_bytes_cap_is_its_expected_evidence_with_headroom_under_the_ceiling() -> None:
    fc = pilot_forecast(50_000)  # 500 MB expected for 10,000 inputs
    expected = fc["evidence_bytes"]
    assert (fc["evidence_files"], expected) == (10_010, 1_000 + 10_000 * 50_000)
    ceiling = FetchCaps(total_bytes=8 << 30)
    caps, how = volume_caps(ceiling, 10_000, fc)
    assert caps.total_bytes == HEADROOM * expected and caps.sized
    assert caps.files == FILES_BASE + FILES_PER_INPUT * 10_000
    assert "the expected evidence copy, 476.8 MiB (10,010 files" in how
    assert f"× {HEADROOM}" in how
    assert sized_bytes(fc) == HEADROOM * expected
    # a tiny evidence copy: the floor; a huge one: the ceiling, never above
    assert volume_caps(ceiling, 10_000, pilot_forecast(10))[0].total_bytes == BYTES_FLOOR
    huge = volume_caps(ceiling, 10_000, pilot_forecast(2 << 20))[0]
    assert huge.total_bytes == 8 << 30 and not huge.sized
    # no evidence measured (an older forecast): the ceiling, said so
    caps, how = volume_caps(ceiling, 10_000, {"possible": True})
    assert caps.total_bytes == 8 << 30 and not caps.sized and "no evidence copy" in how
    assert sized_bytes(None) == 0 and sized_bytes({"evidence_bytes": "9"}) == 0


def test_an_expected_evidence_over_the_ceiling_is_told_in_the_forecast_before_approval() -> None:
    ceiling = FetchCaps(total_bytes=1 << 30, files=50_000)
    fine = with_fetch_caps(pilot_forecast(20_000), ceiling, 10_000)  # 200 MB: × 2 = 400 MB
    row = next(f for f in fine["figures"] if f["key"] == "fetch_caps")
    assert row["label"] == "Results fetch (caps)"
    assert row["value"] == "up to 41,000 files, 381.5 MiB in all, 2.00 GiB per file"
    assert fine["fetch_over_ceiling"] is False and not any(
        "fetch ceiling" in n for n in fine["notes"])
    big = with_fetch_caps(pilot_forecast(200_000), ceiling, 10_000)  # 2 GB expected
    [note] = [n for n in big["notes"] if "fetch ceiling" in n]
    assert big["fetch_over_ceiling"] is True
    assert note.startswith("The volume's evidence copy is expected at 1.86 GiB in 10,010 "
                           "files")
    assert "1.86 GiB over its 1.00 GiB (PREFLIGHT_FETCH_MAX_BYTES)" in note
    assert "10,010 files over its 5,000" in str(over_ceiling(FetchCaps(files=5_000),
                                                              pilot_forecast(1)))
    # a local volume fetches nothing: no row, no note
    local = forecast(forecast_inputs(pilot_items=12, evidence=(0.5, 10, 1 << 40))).to_dict()
    assert with_fetch_caps(local, ceiling, 10_000) == local


def test_the_volumes_plan_and_spec_carry_the_bytes_cap_sized_from_the_pilot(
        tmp_path: Path) -> None:
    make_project(tmp_path)
    inputs = {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": 12}
    loaded = load(tmp_path, dump(merged(volume={"inputs": inputs})))
    fc = pilot_forecast(50_000)
    plan = make_plan(loaded, caps=caps_of(Settings.from_env({})), forecast=fc)
    assert plan.fetch is not None and plan.fetch.endswith(
        f"volume: up to 1,048 files, {HEADROOM * fc['evidence_bytes'] / MIB:.1f} MiB in all, "
        "2.00 GiB per file (bytes sized from the pilot's evidence copy)")
    volume = loaded.manifest.volume
    assert volume is not None
    spec = build_spec(loaded, plan, "v1", inputs=volume.inputs, kind="volume", forecast=fc)
    assert RunSpec.from_dict(spec.to_dict()).results.fetch_max_bytes == sized_bytes(fc)
    pilot = build_spec(loaded, plan, "p1", forecast=fc)
    assert pilot.results.fetch_max_bytes == 0  # a pilot: the bot host's setting
