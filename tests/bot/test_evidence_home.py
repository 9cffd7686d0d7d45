"""The evidence copy never lands on the bot's records of a run (issue 32, High 2): a
``results.copy_to`` in the runs folder is refused by the manifest's rules (field and line,
from a file and from Slack), and again by the fetch; a resume holds the spec's paths to the
run's record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.evidence_home import EvidenceHomeRefused, refuse_evidence_home
from bot.errors import DispatchError, ManifestError
from bot.manifest.load import load_manifest_file
from bot.pilot.evidence_home import copy_to_overlap, overlap
from bot.service import PilotService
from tests.bot.fakes import pilot_script, write_manifest
from tests.bot.test_service import make
from tests.bot.test_submit_once import make as make_with_policy

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]


def results_manifest(root: Path, results: str) -> Path:
    return write_manifest(root, extra=f"results: {results}")


def located(exc: ManifestError) -> list[tuple[str, int | None]]:
    return [(p.loc, p.line) for p in exc.problems]


@pytest.mark.parametrize("results", ["{runs_dir: runs, copy_to: runs}",
                                     "{runs_dir: runs, copy_to: runs/evidence}",
                                     "{runs_dir: runs/, copy_to: ./runs}"])
def test_copy_to_in_the_manifest_s_runs_dir_is_refused_with_its_line(
        tmp_path: Path, results: str) -> None:
    with pytest.raises(ManifestError) as caught:
        load_manifest_file(results_manifest(tmp_path, results))
    assert located(caught.value) == [("results.copy_to", 13)]
    message = caught.value.problems[0].message
    assert "results.runs_dir" in message and "would land among the bot's records" in message


def test_copy_to_beside_the_runs_folder_is_accepted(tmp_path: Path) -> None:
    loaded = load_manifest_file(results_manifest(tmp_path, "{runs_dir: runs, copy_to: ev}"))
    assert loaded.manifest.results.copy_to == "ev"


def test_copy_to_the_bot_s_own_runs_folder_is_refused_at_submission(tmp_path: Path) -> None:
    """No runs_dir in the manifest: the run's runs folder is the bot's own
    ($PREFLIGHT_HOME/runs); copy_to naming it is refused, field and line, nothing made."""
    service, _ = make(tmp_path / "home", lambda run: pilot_script(IDS, refuse=()))
    runs = service.settings.runs_dir
    for copy_to in (runs, runs / "evidence", service.settings.db_path.parent):
        loaded = load_manifest_file(results_manifest(tmp_path / "p",
                                                     f"{{copy_to: {copy_to}}}"))
        with pytest.raises(ManifestError) as caught:
            service.submit(loaded, submitter="bob")
        assert located(caught.value) == [("results.copy_to", 13)]
    assert service.store.runs() == [] and not (runs.exists() and any(runs.iterdir()))


def test_a_slack_manifest_with_copy_to_equal_to_runs_dir_is_refused(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "projects" / "proj", approvers="[U0LEAD]",
                              extra="results: {runs_dir: runs, copy_to: runs}")
    service = make_with_policy(tmp_path)
    with pytest.raises(ManifestError) as caught:
        service.submit_text(manifest.read_text(encoding="utf-8"), source="slack-file.yaml",
                            base_dir=manifest.parent, submitter="U0MEMBER", channel="C0CHAN",
                            thread_ts="1.0", origin="slack")
    assert located(caught.value) == [("results.copy_to", 13)]
    runs = manifest.parent / "runs"
    assert service.store.runs() == [] and not (runs.exists() and any(runs.iterdir()))


def test_the_rule_on_paths() -> None:
    places = [("the run directory", Path("/h/runs/r1")), ("the runs folder", Path("/h/runs"))]
    assert overlap(Path("/h/runs/r1"), places) == "it is the run directory (/h/runs/r1)"
    assert overlap(Path("/h/runs/r1/x"), places) == \
        "it lies inside the run directory (/h/runs/r1)"
    assert overlap(Path("/h"), places) == "it holds the run directory (/h/runs/r1)"
    assert overlap(Path("/h/evidence/r1"), places) is None
    assert copy_to_overlap(Path("/h/runs"), places[1:]) is not None
    assert copy_to_overlap(Path("/h/evidence"), places[1:]) is None


def test_the_fetch_refuses_an_evidence_home_among_the_bot_s_records(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "r1").mkdir(parents=True)
    handle = RunHandle("r1", runs / "r1", runs / "r1" / "spec.json", tmp_path)
    for home, why in ((runs / "r1", "it is the run directory"),
                      (runs / "x" / "r1", "it lies inside the runs folder"),
                      (tmp_path / "state" / "r1", "it lies inside a folder of the bot's own")):
        with pytest.raises(EvidenceHomeRefused) as caught:
            refuse_evidence_home(handle, home, [tmp_path / "state"])
        assert why in str(caught.value) and "nothing was replaced" in str(caught.value)
    refuse_evidence_home(handle, tmp_path / "evidence" / "r1", [tmp_path / "state"])


def started(service: PilotService, root: Path) -> str:
    sub = service.submit(load_manifest_file(write_manifest(root, copy_to=True)),
                         submitter="bob")
    service.starter.start(sub.run_id)
    service.follower.follow(sub.run_id, timeout=30)
    return sub.run_id


@pytest.mark.parametrize(("field", "forged"), [
    (("project", "dir"), "/home/bot/.ssh"), (("inputs", "dir"), "/home/bot/.ssh"),
    (("results", "copy_to"), "/home/bot"), (("project", "requirements"), "/etc/shadow"),
    (("project", "exclude"), []), (("run_id",), "another-run")])
def test_a_resume_refuses_a_spec_whose_paths_left_the_run_s_roots(
        tmp_path: Path, field: tuple[str, ...], forged: object) -> None:
    service, _ = make(tmp_path / "home", lambda run: pilot_script(IDS, refuse=()))
    run_id = started(service, tmp_path / "p")
    run = service.store.run(run_id)
    spec = json.loads(Path(str(run.spec_path)).read_text(encoding="utf-8"))
    if field == ("project", "exclude"):
        spec["project"]["exclude"], forged = ["/home/bot/.ssh"], ["/home/bot/.ssh"]
    else:
        at = spec
        for key in field[:-1]:
            at = at[key]
        at[field[-1]] = forged
    Path(str(run.spec_path)).write_text(json.dumps(spec), encoding="utf-8")
    dispatcher = service.dispatchers["local"]
    before = len(dispatcher.started)  # type: ignore[attr-defined]
    with pytest.raises(DispatchError) as caught:
        service.resume(run_id)
    assert f"its spec.json names {'.'.join(field)} {forged!r}" in str(caught.value)
    assert len(dispatcher.started) == before  # type: ignore[attr-defined]
    after = service.store.get_run(run_id)
    assert after["status"] == "dispatch_failed"
    assert "spec.json" in after["first_error"]["message"]


def test_every_record_the_bot_keeps_in_a_run_directory_is_one_the_fetch_leaves() -> None:
    from bot.dispatch.bot_records import BOT_RECORDS, fetched_name
    from bot.dispatch.calibration_sample import SAMPLE_DIR
    from bot.dispatch.corpus import LISTING_FILE
    from bot.dispatch.inputs_check import INPUTS_FILE
    from bot.dispatch.volume_cluster import CLUSTER_FILE
    from bot.service.end_lock import LOCK_FILE
    from bot.service.report_files import PICTURE, REPORT

    ours = {INPUTS_FILE, LISTING_FILE, CLUSTER_FILE, REPORT, PICTURE, LOCK_FILE, "spec.json",
            "manifest.yaml", "remote.json", "evidence-fetch.json", SAMPLE_DIR}
    assert ours == BOT_RECORDS
    assert not any(fetched_name(n) for n in ours | {".fetch", ".fetch-r1"})
    assert fetched_name("events.jsonl") and fetched_name("outputs")
