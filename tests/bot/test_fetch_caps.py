"""The results fetch's caps sized per run (bot/pilot/fetch_caps.py) and shown in the plan:
the files a run's fetch may bring follow from its inputs, never above the bot host's
settings."""

from __future__ import annotations

from pathlib import Path

from bot.messages.views import plan_message
from bot.pilot.fetch_caps import FILES_BASE, FILES_PER_INPUT, FetchCaps, caps_of
from bot.pilot.plan import Plan, make_plan
from bot.settings import Settings
from tests.bot.manifest_helpers import dump, load, make_project, merged
from tests.bot.runs import run_of


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
        "2.00 GiB per file; volume: up to 1,030 files, 4.00 GiB in all, 2.00 GiB per file")
    assert Plan.from_dict(plan.to_dict()).fetch == plan.fetch
    shown = plan_message(run_of(id="r-a1", name="demo", attempt=1, plan=plan.to_dict()))
    pairs = dict(next(b.pairs for b in shown.blocks if hasattr(b, "pairs")))
    assert pairs["Results fetch (caps)"] == plan.fetch
