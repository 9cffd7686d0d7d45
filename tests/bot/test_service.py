"""The service against a scripted dispatcher: recording, verdict, decisions, restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.errors import DecisionRefused, DispatchError
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.service import PilotService
from bot.service.handles import handle_for
from bot.settings import Settings
from bot.store import Run, Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest
from tests.bot.runs import run_of
from tests.events_check import assert_recorded_whole

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]


def make(tmp_path: Path, script: Any, **kw: Any) -> tuple[PilotService, RecordingNotifier]:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    notifier = RecordingNotifier()
    service = PilotService(settings, Store(settings.db_path),
                           {"local": ScriptedDispatcher(script, **kw)}, notifier)
    return service, notifier


def submit(service: PilotService, tmp_path: Path, **kw: Any) -> str:
    loaded = load_manifest_file(write_manifest(tmp_path, **kw))
    sub = service.submit(loaded, submitter="bob")
    service.starter.start(sub.run_id)
    return sub.run_id


def test_events_recorded_in_order_and_verdict_passes(tmp_path: Path) -> None:
    service, notifier = make(tmp_path, lambda run: pilot_script(IDS, refuse=()), step=5)
    run_id = submit(service, tmp_path)
    run = service.follower.follow(run_id, timeout=30)
    assert run["status"] == "awaiting_decision" and run["outcome"] == "passed"
    assert_recorded_whole(service.store, run_id)  # progress as each attempt's latest
    assert run["last_seq"] == len(pilot_script(IDS, refuse=()))
    assert [i["id"] for i in service.store.items(run_id)] == IDS
    assert run["balance"]["recheck"] == {"accepted": 4, "refused": 0, "total": 4, "ok": True}
    keys = [m.key for m in notifier.history]
    assert keys[0] == "plan" and keys.index("verdict") < keys.index("decision")
    assert keys.count("balance") == 1


def test_runner_that_lies_about_its_balance_is_caught(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=(), lie=True,
                                                         drop=("doc-03",)))
    run = service.follower.follow(submit(service, tmp_path), timeout=30)
    assert run["outcome"] == "failed"
    kinds = {p["kind"] for p in run["balance"]["problems"]}
    assert "recheck" in kinds
    assert any("disagree" in p["detail"] for p in run["balance"]["problems"])


def test_runner_dying_without_finishing_is_a_failed_run_with_the_stage(tmp_path: Path) -> None:
    service, notifier = make(tmp_path, lambda run: pilot_script(IDS, finish=False), exit_code=-9)
    run = service.follower.follow(submit(service, tmp_path), timeout=30)
    assert run["outcome"] == "failed"
    assert run["first_error"]["type"] == "RunnerExited"
    assert run["first_error"]["stage"] == "balance"  # the last stage that started
    message = run["first_error"]["message"]
    assert "killed by signal 9 (SIGKILL) during stage balance" in message
    assert "None" not in message
    assert "running" not in {s["state"] for s in service.store.stages(run["id"])}
    assert ("first_error" in [m.key for m in notifier.history])


def test_restart_neither_loses_nor_repeats_events(tmp_path: Path) -> None:
    script = pilot_script(IDS, refuse=())
    service, notifier = make(tmp_path, lambda run: script, step=7)
    run_id = submit(service, tmp_path)
    service.follower.pump(run_id)
    service.follower.pump(run_id)
    seen = service.store.get_run(run_id)["last_seq"]
    assert 0 < seen < len(script)
    # A new service on the same database and the same (still running) dispatcher.
    dispatcher = service.dispatchers["local"]
    again = PilotService(service.settings, Store(service.settings.db_path),
                         {"local": dispatcher}, notifier)
    run = again.follower.follow(run_id, timeout=30)
    assert_recorded_whole(again.store, run_id)
    assert run["last_seq"] == len(script)
    assert run["outcome"] == "passed"


def test_same_lines_read_twice_are_recorded_once(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    run_id = submit(service, tmp_path)
    service.follower.follow(run_id, timeout=30)
    before = len(service.store.events(run_id))
    # Replay the whole file from offset 0, as a follower that lost its offset would.
    dispatcher = service.dispatchers["local"]
    events, offset = dispatcher.read_events(handle_for(service.store.run_record(run_id)), 0)
    assert service.store.record_events(run_id, events, offset) == []
    assert len(service.store.events(run_id)) == before
    assert len(service.store.items(run_id)) == 4


def test_each_attempt_gets_a_new_directory(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    first = submit(service, tmp_path)
    second = submit(service, tmp_path)
    a, b = service.store.get_run(first), service.store.get_run(second)
    assert a["run_dir"] != b["run_dir"] and (a["attempt"], b["attempt"]) == (1, 2)
    assert sorted([first, second]) == [first, second]  # ids sort by time
    with pytest.raises(DispatchError):
        service.starter.start(first)  # an attempt is never started twice


def test_decision_rules(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    run_id = submit(service, tmp_path, two_person="true", approvers="[alice, bob]")
    service.follower.follow(run_id, timeout=30)
    with pytest.raises(DecisionRefused, match="not an approver"):
        service.decider.decide(run_id, "approve", "looks good", "mallory")
    with pytest.raises(DecisionRefused, match="two-person"):
        service.decider.decide(run_id, "approve", "looks good", "bob")
    with pytest.raises(DecisionRefused, match="reason is required"):
        service.decider.decide(run_id, "approve", "  ", "alice")
    record = service.decider.decide(run_id, "approve", "11 of 12 as expected", "alice")
    assert record["decision"] == "approve" and record["override"] == 0
    with pytest.raises(DecisionRefused, match="already decided"):
        service.decider.decide(run_id, "revise", "second thoughts", "alice")
    rows = service.store.decisions(run_id)
    assert [(r["by"], r["accepted"]) for r in rows] == [
        ("mallory", 0), ("bob", 0), ("alice", 0), ("alice", 1), ("alice", 0)]
    assert service.store.get_run(run_id)["status"] == "decided"


def test_failed_pilot_needs_an_explicit_override(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=(), drop=("doc-02",)))
    run_id = submit(service, tmp_path)
    assert service.follower.follow(run_id, timeout=30)["outcome"] == "failed"
    with pytest.raises(DecisionRefused, match="override"):
        service.decider.decide(run_id, "approve", "ship it", "alice")
    record = service.decider.decide(run_id, "approve", "override: doc-02 is a known bad scan",
                                    "alice")
    assert record["override"] == 1


def test_changes_since_previous_attempt_are_listed(tmp_path: Path) -> None:
    service, notifier = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    submit(service, tmp_path)
    path = write_manifest(tmp_path, extra="diagnostics: {min_free_disk_gib: 0.5}")
    text = path.read_text().replace("days: 3", "days: 7")
    path.write_text(text.replace("[invoice, contract]", "[invoice, contract, support]"))
    sub = service.submit(load_manifest_file(path), submitter="bob")
    changes = service.store.get_run(sub.run_id)["changes"]
    assert {c["path"] for c in changes} == {"hardware.days", "diagnostics.min_free_disk_gib",
                                             "task.categories"}
    assert {c["path"] for c in changes if c["factor"]} == {"diagnostics.min_free_disk_gib",
                                                            "task.categories"}
    plan = notifier.latest[(sub.run_id, "plan")]
    assert any("one factor at a time" in getattr(b, "text", "") for b in plan.blocks)


def test_approval_with_a_volume_launches_the_full_run(tmp_path: Path) -> None:
    service, notifier = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    volume = ('volume: {inputs: {dir: data/pilote, pattern: "doc-*.txt", expected_count: 4}, '
              'nodes: 1}')
    run_id = submit(service, tmp_path, extra=volume)
    service.follower.follow(run_id, timeout=30)
    record = service.decider.decide(run_id, "approve", "pilot clean", "alice")
    volume_id = record["volume_run"]
    assert volume_id and volume_id.endswith("-v1")
    vol = service.store.get_run(volume_id)
    assert (vol["kind"], vol["parent_run"], vol["status"]) == ("volume", run_id, "running")
    assert service.follower.follow(volume_id, timeout=30)["outcome"] == "passed"
    # The volume's messages go to the pilot's thread: same channel/thread as the pilot.
    assert vol["thread_ts"] == service.store.get_run(run_id)["thread_ts"]
    assert (volume_id, "verdict") in notifier.latest


def test_approval_without_a_volume_only_records(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    run_id = submit(service, tmp_path)
    service.follower.follow(run_id, timeout=30)
    record = service.decider.decide(run_id, "approve", "pilot clean", "alice")
    assert record["volume_run"] is None
    assert [r["kind"] for r in service.records.runs()] == ["pilot"]


def test_reap_closes_a_run_whose_runner_ended_unseen(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, finish=False), exit_code=137)
    run_id = submit(service, tmp_path)
    assert service.follower.reap(run_id) is False  # events were read: not a dead runner yet
    assert service.follower.reap(run_id) is True
    run = service.store.get_run(run_id)
    assert (run["status"], run["outcome"]) == ("awaiting_decision", "failed")
    assert "status 137 (128 + signal 9, SIGKILL)" in run["first_error"]["message"]
    assert service.follower.reap(run_id) is False


class FailingFetch(ScriptedDispatcher):
    def fetch_results(self, handle: object) -> None:
        from bot.errors import DispatchError

        raise DispatchError("evidence fetched to /x but it does not verify: SHA256SUMS: a.txt")


def test_evidence_that_fails_to_verify_on_the_bot_host_fails_the_pilot(tmp_path: Path) -> None:
    script = pilot_script(IDS, refuse=())
    script.insert(-1, {"type": "evidence", "dest": "/node/evidence", "files": 5,
                       "verified": True})
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    service = PilotService(settings, Store(settings.db_path),
                           {"local": FailingFetch(lambda run: script)}, RecordingNotifier())
    run = service.follower.follow(submit(service, tmp_path, copy_to=True), timeout=30)
    assert run["evidence"]["verified"] is False
    assert "does not verify" in run["evidence"]["fetch_error"]
    assert run["outcome"] == "failed"


def test_error_text_does_not_repeat_the_type() -> None:
    from bot.messages.views import error_text

    assert error_text({"type": "ImportError", "message": "cannot import torch: ImportError: x"}) \
        == "cannot import torch: ImportError: x"
    assert error_text({"type": "RunnerExited", "message": "ended"}) == "RunnerExited: ended"


class SlowStart(ScriptedDispatcher):
    """A dispatcher whose start blocks until the test lets it go on."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        import threading

        self.entered, self.go_on = threading.Event(), threading.Event()

    def start(self, handle: Any) -> int | None:
        self.entered.set()
        assert self.go_on.wait(timeout=30)
        return super().start(handle)


def test_a_run_being_dispatched_is_not_taken_for_dead(tmp_path: Path) -> None:
    import threading

    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    slow = SlowStart(lambda run: pilot_script(IDS, refuse=()))
    service = PilotService(settings, Store(settings.db_path), {"local": slow},
                           RecordingNotifier())
    sub = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob")
    starter = threading.Thread(target=service.starter.start, args=(sub.run_id,))
    starter.start()
    assert slow.entered.wait(timeout=30)
    assert service.store.get_run(sub.run_id)["status"] == "dispatching"
    assert service.store.active_runs() == []  # the watch does not look at it yet
    assert service.follower.reap(sub.run_id) is False
    slow.go_on.set()
    starter.join(timeout=30)
    assert service.store.get_run(sub.run_id)["status"] == "running"
    assert service.follower.follow(sub.run_id, timeout=30)["outcome"] == "passed"


def test_two_resumes_of_one_run_cannot_both_start(tmp_path: Path) -> None:
    """A second resume that read the run's state before the first took it to dispatching
    (two clicks, two terminals) is refused: two drivers of one volume would each clean up
    the other's Ray."""
    import threading

    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    # the first attempt lost doc-02 (failed); the resumed runner reports only it
    attempts = [pilot_script(IDS, refuse=(), drop=("doc-02",)),
                pilot_script(IDS, refuse=(), drop=("doc-01", "doc-03", "doc-04"), lie=True)]
    slow = SlowStart(lambda run: attempts.pop(0))
    service = PilotService(settings, Store(settings.db_path), {"local": slow},
                           RecordingNotifier())
    slow.go_on.set()
    run_id = submit(service, tmp_path)
    assert service.follower.follow(run_id, timeout=30)["status"] == "awaiting_decision"
    slow.entered.clear()
    slow.go_on.clear()
    first = threading.Thread(target=service.resume, args=(run_id,))
    first.start()
    assert slow.entered.wait(timeout=30)
    assert service.store.get_run(run_id)["status"] == "dispatching"
    with pytest.raises(DispatchError, match="being started by another start or resume"):
        service.starter.start(run_id, resume=True)  # the second resume, past its own state check
    with pytest.raises(DispatchError, match="being started"):
        service.resume(run_id)
    slow.go_on.set()
    first.join(timeout=30)
    assert len(slow.started) == 2  # the first start and one resume, never a third
    assert service.follower.follow(run_id, timeout=30)["status"] == "awaiting_decision"


def test_a_run_refused_by_its_lease_can_be_started_later(tmp_path: Path) -> None:
    from bot.errors import LeaseError

    provisioned = {"ok": False}

    def guard(run: Run) -> None:
        if not provisioned["ok"]:
            raise LeaseError("lease of gpu-1 is 'ordered': not provisioned")

    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    service = PilotService(settings, Store(settings.db_path),
                           {"local": ScriptedDispatcher(lambda run: pilot_script(IDS))},
                           RecordingNotifier(), lease_guard=guard)
    sub = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob")
    with pytest.raises(LeaseError):
        service.starter.start(sub.run_id)
    row = service.store.get_run(sub.run_id)
    assert row["status"] == "planned"
    # not planned and forgotten: refused (lease), with why (issue 37, point 9)
    assert (row["first_error"]["stage"], row["first_error"]["message"]) == (
        "lease", "lease of gpu-1 is 'ordered': not provisioned")
    assert f"`preflight resume {sub.run_id}`" in row["first_error"]["hint"]
    thread = {m.key: m for m in service.publisher.thread_messages(sub.run_id)}
    assert thread["status"].blocks[0].text.endswith("(refused (lease))")
    assert "not provisioned" in str(thread["first_error"].blocks)
    from bot.console.runs import runs_lines

    line = runs_lines([service.store.run(sub.run_id)], width=200)[1]
    assert "refused (lease)" in line and "lease: lease of gpu-1 is 'ordered'" in line
    provisioned["ok"] = True
    service.resume(sub.run_id)  # what `preflight resume RUN` does once provisioned
    run = service.follower.follow(sub.run_id, timeout=30)
    assert (run["status"], run["first_error"]) == ("awaiting_decision", None)


def test_a_start_interrupted_by_a_bot_crash_is_settled_by_the_watch(tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    from bot.schedule import watch_runs

    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    started = submit(service, tmp_path)  # its runner started: events will show it
    crashed = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob")
    # A bot that died between "dispatching" and the runner's start leaves these two rows:
    for run_id in (started, crashed.run_id):
        status = service.store.get_run(run_id)["status"]
        service.store.transition(run_id, (status,), "dispatching", started_at=_iso_now())
    now = datetime.now(timezone.utc)
    watch_runs(service, now)  # within the grace: maybe still being started, left alone
    assert {service.store.get_run(r)["status"] for r in (started, crashed.run_id)} == {
        "dispatching"}
    watch_runs(service, now + timedelta(seconds=300))
    assert service.store.get_run(crashed.run_id)["status"] == "dispatch_failed"
    assert service.store.get_run(crashed.run_id)["first_error"]["type"] == "DispatchInterrupted"
    assert service.store.get_run(started)["status"] in ("running", "awaiting_decision")
    service.resume(crashed.run_id)  # and it can be started again
    assert service.follower.follow(crashed.run_id, timeout=30)["outcome"] == "passed"


def _iso_now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def test_a_runner_that_sees_more_problems_than_the_events_is_not_called_a_liar(
        tmp_path: Path) -> None:
    script = pilot_script(IDS, refuse=())
    balance = next(e for e in script if e["type"] == "balance")
    balance.update(ok=False, problems=[{"kind": "invented", "id": "doc-99",
                                        "detail": "the handler returned an id not asked for"}])
    service, _ = make(tmp_path, lambda run: script)
    run = service.follower.follow(submit(service, tmp_path), timeout=30)
    kinds = [p["kind"] for p in run["balance"]["problems"]]
    assert kinds == ["invented"] and run["balance"]["ok"] is False
    assert run["outcome"] == "failed"


def test_a_dead_runner_is_described_without_none_or_library_warnings() -> None:
    from bot.pilot.death import last_output, runner_death

    log = ('{"seq": 1, "type": "run.started"}\n'
           "/venv/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed to init\n"
           "  cpu = _conversion_method_template(device=torch.device('cpu'))\n"
           "loading model weights from /data/w.bin\n")
    assert last_output(log) == "loading model weights from /data/w.bin"
    error = runner_death(None, None, None, "")
    assert "None" not in error["message"] and "not known here" in error["message"]
    assert error["stage"] == "prepare"


def test_a_large_balance_keeps_the_rows_shown_and_names_the_total(tmp_path: Path) -> None:
    """The run's row holds the rows a message shows, not one per item; the message still
    says how many there are and attaches balance.csv, which has them all."""
    from bot.messages.model import Attachment, Table
    from bot.messages.views import MAX_TABLE_ROWS, balance_message

    ids = [f"doc-{n:02d}" for n in range(1, 61)]
    service, _ = make(tmp_path, lambda run: pilot_script(ids, refuse=()), step=20)
    run_id = submit(service, tmp_path, count=60)
    run = service.follower.follow(run_id, timeout=30)
    assert run["outcome"] == "passed" and run["balance"]["recheck"]["total"] == 60
    assert run["balance"]["items_total"] == 60
    assert [i["id"] for i in run["balance"]["items"]] == ids[:MAX_TABLE_ROWS]
    assert len(service.store.items(run_id)) == 60  # every row is still recorded
    message = balance_message(run_of(run), "/tmp/balance.csv")
    assert message is not None
    table = [b for b in message.blocks if isinstance(b, Table) and b.columns[0] == "id"][0]
    assert (len(table.rows), table.total_rows) == (MAX_TABLE_ROWS, 60)
    assert any(isinstance(b, Attachment) for b in message.blocks)


def test_the_balance_box_shows_the_refusals_and_the_first_ids_in_order(tmp_path: Path) -> None:
    """A volume records its items as its workers finish them: the balance box began at
    doc-00051 (the fastest worker's first batch). It now shows every refusal and the first
    ids, in id order (issue 37)."""
    ids = [f"doc-{n:05d}" for n in range(60)]
    order = ids[50:] + ids[:50]  # the second worker's batch came back first
    service, _ = make(tmp_path, lambda run: pilot_script(order, refuse=("doc-00055",)))
    run = service.follower.follow(submit(service, tmp_path, count=60), timeout=30)
    shown = [i["id"] for i in run["balance"]["items"]]
    assert shown == sorted(shown) and len(shown) == 40 and run["balance"]["items_total"] == 60
    assert shown[:3] == ["doc-00000", "doc-00001", "doc-00002"] and "doc-00055" in shown


def test_a_volume_s_per_worker_rates_stay_shown_between_the_events_that_carry_them(
        tmp_path: Path) -> None:
    """The driver sends the per-worker rates once in 30 s (issue 34): the progress events
    between show the last ones the runner sent."""
    script = pilot_script(IDS, refuse=())
    at = [n for n, e in enumerate(script) if e["type"] == "progress"]
    for k, n in enumerate(at):
        script[n].update(items_per_s=10.0 + k, eta_s=5)
    script[at[0]]["per_card"] = {"w0@h[cpu]": 4.0, "w1@h[cpu]": 6.0}
    service, _ = make(tmp_path, lambda run: script, step=1)
    run_id = submit(service, tmp_path)
    paces = []
    for _ in range(at[-1] + 1):
        service.follower.pump(run_id)
        meter = service.publisher._progress.get(run_id)
        if meter is not None and meter.done:
            paces.append(meter.pace)
    assert paces and all("2 worker(s): w0@h[cpu] 4.0, w1@h[cpu] 6.0" in p for p in paces)
    assert "13.0 items/s" in paces[-1]  # the latest event's own figures
