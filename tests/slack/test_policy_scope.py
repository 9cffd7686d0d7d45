"""Issue 24 (items 1, 4, 5 and the Low list) as a plain channel member would try them,
over signed requests and the Web API emulator: every node a run may use is checked, each
team names only its own projects, a run is acted on only from its channel and by whoever
holds the role, and a channel sees only its own runs. Each refusal is recorded with its
rule; the same action is then allowed for whoever holds the role.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.errors import PolicyRefused
from tests.slack.conftest import APPROVER, CHANNEL, SUBMITTER, TEAM_POLICY, Harness, team_policy
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher
from tests.slack.test_cli import env_for
from tests.slack.test_policy import command_manifest, project, refused_in_thread, strict

MEMBER, OTHER = "U0MEMBER", "C0OTHER"
PIN = "SHA256:" + "Q" * 43


def rules(h: Harness) -> set[tuple[str, str, str]]:
    return {(r["who"], r["action"], r["rule"]) for r in h.store.refusals()}


def running_run(h: Harness, emulator: SlackEmulator, text: str) -> tuple[str, str]:
    ts, _ = h.mention(f"```yaml\n{text}```", user=SUBMITTER)
    emulator.wait_for(lambda: h.store.list_runs())
    run_id = str(h.store.list_runs()[0]["id"])
    h.wait_status(run_id, ("running",))
    return ts, run_id


def test_a_volume_on_the_bot_host_is_refused_and_the_approval_names_the_nodes(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    marker = tmp_path / "marker"
    # The attack: the pilot on the listed SSH node, the volume (with a command) on the bot.
    text = command_manifest(tmp_path, marker, volume=3).replace(
        "node:\n  kind: local\n", "node:\n  kind: ssh\n  host: gpu-1.example\n  user: gpu\n"
    ) + "  nodes:\n    - kind: local\n"
    h: Harness = make_harness(ReplayDispatcher(),
                              policy=strict(tmp_path, "nodes: [gpu@gpu-1.example]\n"))
    ts, _ = h.mention(f"```yaml\n{text}```", user=MEMBER)
    note = refused_in_thread(h, emulator, ts, MEMBER)
    assert "volume.nodes[0].kind (line" in note and "rule `nodes`" in note
    assert "rule `task_command.local`" in note and "(volume.nodes[0])" in note
    assert h.store.list_runs() == [] and not marker.exists()
    assert rules(h) == {(MEMBER, "submit", "nodes"), (MEMBER, "submit", "task_command.local")}
    # A team whose policy lets it use the bot host: accepted, and the approval shows where
    # the volume will spend (nodes, cards, hosts), in the message and in the modal.
    h.service.guard.policy = team_policy(tmp_path)
    local = text.replace("node:\n  kind: ssh\n  host: gpu-1.example\n  user: gpu\n",
                         "node:\n  kind: local\n")
    ts, _ = h.mention(f"```yaml\n{local}```", user=SUBMITTER)
    emulator.wait_for(lambda: h.store.list_runs())
    run = h.settle(str(h.store.list_runs()[0]["id"]))
    assert run["status"] == "awaiting_decision"
    ref = h.store.message_ref(run["id"], "decision", "slack")
    assert ref is not None
    shown = json.dumps(emulator.messages[(CHANNEL, ref["ref"])].blocks)
    assert "Approving launches the volume on" in shown
    assert "volume.nodes[0]: local (the bot host itself)" in shown and "the bot host" in shown
    assert "Cards" in shown and "Hosts" in shown
    h.click("approve", run["id"], user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: emulator.views)
    modal = json.dumps(next(iter(emulator.views.values())))
    assert "Approving launches the volume on" in modal and "local (the bot host itself)" in modal


def test_stop_needs_the_runs_channel_and_a_role_and_resume_checks_the_nodes_again(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    dispatcher = ReplayDispatcher(pause_after=20)
    h: Harness = make_harness(dispatcher)
    ts, run_id = running_run(h, emulator, project(tmp_path))
    # From another channel, even by its submitter: refused (the rule: the run's channel).
    _, body = h.command(f"stop {run_id} not mine to stop", user=SUBMITTER, channel=OTHER)
    assert "Refused by the bot's policy" in body and "Stopping" not in body
    emulator.wait_for(lambda: [e for e in emulator.ephemerals if e["channel"] == OTHER])
    note = [e for e in emulator.ephemerals if e["channel"] == OTHER][-1]["text"]
    assert "rule `channel`" in note and "belongs to another channel" in note
    # A plain member of the run's channel: the slash command and the Stop button, refused.
    h.command(f"stop {run_id} I can", user=MEMBER)
    h.click("stop", run_id, user=MEMBER, thread_ts=ts)
    emulator.wait_for(lambda: len([r for r in h.store.refusals() if r["who"] == MEMBER]) == 2)
    assert "only its submitter" in [e for e in emulator.ephemerals
                                    if e["user"] == MEMBER][-1]["text"]
    assert emulator.views == {} and h.store.get_run(run_id)["status"] == "running"
    assert rules(h) == {(SUBMITTER, "stop", "channel"), (MEMBER, "stop", "roles.approvers")}
    # Its submitter, from its channel: stopped.
    _, body = h.command(f"stop {run_id} lease ends tonight", user=SUBMITTER)
    assert "Stopping" in body
    dispatcher.release()
    run = h.settle(run_id)
    assert run["status"] == "stopped" and run["stop"]["by"] == SUBMITTER
    # A resume of this Slack run meets the policy in force now: local no longer allowed.
    h.service.guard.policy = team_policy(tmp_path, TEAM_POLICY.format(root=tmp_path).replace(
        "nodes: [local]", "nodes: [gpu-1.example]"))
    with pytest.raises(PolicyRefused) as caught:
        h.service.resume(run_id)
    assert [r.rule for r in caught.value.refusals] == ["nodes"]
    assert "node.kind (line" in caught.value.refusals[0].message
    assert ("resume", "nodes") in {(r["action"], r["rule"]) for r in h.store.refusals()}
    assert h.store.get_run(run_id)["status"] == "stopped"
    h.service.guard.policy = team_policy(tmp_path)
    h.service.resume(run_id)
    h.bot.followers.follow(run_id)
    assert h.settle(run_id)["status"] == "awaiting_decision"


def test_fix_env_and_revise_need_a_role(tmp_path: Path, emulator: SlackEmulator,
                                        make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    ts, _ = h.mention(f"```yaml\n{project(tmp_path)}```", user=SUBMITTER)
    emulator.wait_for(lambda: h.store.list_runs())
    run = h.settle(str(h.store.list_runs()[0]["id"]))
    h.mention("fix-env the drivers are wrong", user=MEMBER, thread_ts=ts)
    h.click("revise", run["id"], user=MEMBER, thread_ts=ts)
    emulator.wait_for(lambda: len(h.store.refusals()) == 2)
    assert rules(h) == {(MEMBER, "fix-env", "roles.approvers"),
                        (MEMBER, "revise", "roles.approvers")}
    assert emulator.views == {} and h.store.decisions(run["id"]) == []
    assert h.store.get_run(run["id"])["status"] == "awaiting_decision"
    h.mention("revise the batch size is wrong", user=SUBMITTER, thread_ts=ts)
    decided = h.wait_status(run["id"], ("decided",))
    assert [(d["decision"], d["by"]) for d in h.store.decisions(decided["id"])] == [
        ("revise", SUBMITTER)]


def test_each_team_names_only_its_own_projects(tmp_path: Path, emulator: SlackEmulator,
                                               make_harness: Any) -> None:
    text = project(tmp_path)  # tmp_path/projects/proj: team B's project
    (tmp_path / "projects" / "team-a").mkdir()
    teams = (f"team_roots:\n  - channels: [{CHANNEL}]\n    roots: [{tmp_path}/projects/team-a]\n"
             f"  - channels: [C0TEAMB]\n    roots: [{tmp_path}/projects/proj]\n"
             "nodes: [local]\n")
    h: Harness = make_harness(ReplayDispatcher(), policy=strict(tmp_path, teams))
    ts, _ = h.mention(f"```yaml\n{text}```", user=MEMBER)
    note = refused_in_thread(h, emulator, ts, MEMBER)
    assert "rule `team_roots`" in note and "project.dir (line" in note
    assert "(team_roots.0)" in note and h.store.list_runs() == []
    assert rules(h) == {(MEMBER, "submit", "team_roots")}
    h.mention(f"```yaml\n{text}```", user=MEMBER, channel="C0TEAMB")  # team B's channel
    emulator.wait_for(lambda: h.store.list_runs())
    run = h.settle(str(h.store.list_runs()[0]["id"]))
    assert run["channel"] == "C0TEAMB" and run["status"] == "awaiting_decision"


def test_a_channel_sees_its_own_runs_and_the_home_tab_the_users(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    text = project(tmp_path)
    h.mention(f"```yaml\n{text}```", user=SUBMITTER)
    emulator.wait_for(lambda: h.store.list_runs())
    run_id = str(h.settle(str(h.store.list_runs()[0]["id"]))["id"])
    for verb in ("runs", "status", f"status {run_id}", "status latest", "status pilote-demo",
                 f"status {run_id[:8]}"):
        _, elsewhere = h.command(verb, user=MEMBER, channel=OTHER)
        assert "no run" in elsewhere or "No runs" in elsewhere, verb
        assert run_id not in elsewhere.replace(f"no run '{run_id}'", ""), verb
        _, here = h.command(verb, user=MEMBER)
        assert run_id in here, verb
    # The other channel's own (newer) run: each channel's `latest` and name are its own.
    h.mention(f"```yaml\n{text}```", user=SUBMITTER, channel=OTHER)
    emulator.wait_for(lambda: len(h.store.list_runs()) == 2)
    other_id = str(h.settle(str(h.store.list_runs()[0]["id"]))["id"])
    for verb in ("status latest", "status pilote-demo", "runs"):
        _, here = h.command(verb, user=MEMBER)
        assert run_id in here and other_id not in here, verb
        _, there = h.command(verb, user=MEMBER, channel=OTHER)
        assert other_id in there and run_id not in there, verb
    h.event({"type": "app_home_opened", "user": MEMBER, "channel": "D0HOME", "tab": "home"})
    h.event({"type": "app_home_opened", "user": SUBMITTER, "channel": "D0HOME", "tab": "home"})
    emulator.wait_for(lambda: MEMBER in emulator.home and SUBMITTER in emulator.home)
    assert run_id not in json.dumps(emulator.home[MEMBER])
    assert run_id in json.dumps(emulator.home[SUBMITTER])


def test_a_host_key_pin_from_slack_is_the_policys_or_refused(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = project(tmp_path).replace(
        "node:\n  kind: local\n",
        f"node:\n  kind: ssh\n  host: gpu-1.example\n  host_key_fingerprint: \"{PIN}\"\n")
    h: Harness = make_harness(ReplayDispatcher(),
                              policy=strict(tmp_path, "nodes: [gpu-1.example]\n"))
    ts, _ = h.mention(f"```yaml\n{text}```", user=MEMBER)
    note = refused_in_thread(h, emulator, ts, MEMBER)
    assert "node.host_key_fingerprint (line" in note and "rule `nodes`" in note
    assert h.store.list_runs() == []
    h.service.guard.policy = strict(tmp_path, f"nodes: ['gpu-1.example {PIN}']\n")
    h.mention(f"```yaml\n{text}```", user=MEMBER)
    emulator.wait_for(lambda: h.store.list_runs())  # accepted (its lease decides the start)
    assert h.store.list_runs()[0]["node"]["host_key_fingerprint"] == PIN


def test_serve_warns_when_a_role_names_a_user_group(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("roles:\n  approvers: [U0LEAD, S0LEADS]\n")
    done = subprocess.run([sys.executable, "-m", "bot", "serve", "--http"], cwd=tmp_path,
                          env=env_for(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2  # no tokens here: it stops after the policy's warning
    assert "warning: roles.approvers names Slack user group(s) S0LEADS" in done.stderr
    assert "line 2" in done.stderr
