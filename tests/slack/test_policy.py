"""The bot's policy against a channel member, over signed requests and the Web API emulator.

Each hole as a member would use it: refused (privately, plus one line in the thread),
nothing run, nothing leaked, nothing recorded but the refusal; then the same action
allowed for whoever holds the role.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from bot.manifest.load import load_manifest
from bot.nodes.local import LocalDispatcher
from bot.policy import Policy
from bot.settings import Settings
from tests.slack.conftest import APPROVER, CHANNEL, Harness, team_policy
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project
from tests.slack.test_cli import env_for

MEMBER, OPERATOR = "U0MEMBER", "U0OPERATOR"


def strict(root: Path, extra: str = "") -> Policy:
    """A team's policy: named approvers and operator, the default roots, and ``extra``."""
    return team_policy(root, "roles:\n  approvers: [U0APPROVER]\n"
                             "  lease_operators: [U0OPERATOR]\n" + extra)


def project(root: Path, **kw: Any) -> str:
    """A project under the default root ($PREFLIGHT_HOME/projects) and its manifest text."""
    text = make_project(root / "projects", **kw)
    return text.replace("  dir: ../proj\n", "  dir: ../projects/proj\n")


def leaked(emulator: SlackEmulator, token: str) -> bool:
    return any(token in json.dumps(call.params, default=str) for call in emulator.calls)


def refused_in_thread(h: Harness, emulator: SlackEmulator, ts: str, user: str) -> str:
    """The private refusal's text, once the thread's one line says it was refused."""
    emulator.wait_for(lambda: [m for m in emulator.thread(CHANNEL, ts)[1:]
                               if "refused by the bot's policy" in m.text])
    notes = [e for e in emulator.ephemerals if e["user"] == user]
    assert notes and "Refused by the bot's policy" in notes[-1]["text"]
    assert len(emulator.thread(CHANNEL, ts)) == 2  # the user's message and one line
    return str(notes[-1]["text"])


def command_manifest(root: Path, marker: Path, **kw: Any) -> str:
    code = f"open({str(marker)!r}, 'w').write('ran on the bot host')"
    return project(root, **kw).replace(
        "  handler: runner.workloads.classify:handle\n",
        f"  command: [{json.dumps(sys.executable)}, -c, {json.dumps(code)}]\n")


def test_a_local_command_from_slack_is_refused(tmp_path: Path, emulator: SlackEmulator,
                                               make_harness: Any) -> None:
    marker = tmp_path / "marker"
    text = command_manifest(tmp_path, marker)
    local = LocalDispatcher(sys.executable, env=dict(Settings.from_env().runner_env))
    h: Harness = make_harness(local, policy=strict(tmp_path))
    ts, (status, _) = h.mention(f"```yaml\n{text}```", user=MEMBER)
    assert status == 200
    note = refused_in_thread(h, emulator, ts, MEMBER)
    assert "rule `nodes`" in note and "nodes is not set in" in note
    # Local allowed, but not its commands: still refused, naming that rule and its line.
    h.service.guard.policy = strict(tmp_path, "nodes: [local]\n")
    ts, _ = h.mention(f"```yaml\n{text}```", user=MEMBER)
    note = refused_in_thread(h, emulator, ts, MEMBER)
    assert "rule `task_command.local`" in note and "task.command (line" in note
    assert h.store.list_runs() == [] and not marker.exists()
    assert {(r["who"], r["action"], r["rule"]) for r in h.store.refusals()} == {
        (MEMBER, "submit", "nodes"), (MEMBER, "submit", "task_command.local")}


def test_a_local_command_runs_where_the_policy_allows_it(tmp_path: Path,
                                                         emulator: SlackEmulator,
                                                         make_harness: Any) -> None:
    marker = tmp_path / "marker"
    text = command_manifest(tmp_path, marker, real_docs=True)
    allowed = strict(tmp_path, "nodes: [local]\ntask_command: {local: true}\n")
    local = LocalDispatcher(sys.executable, env=dict(Settings.from_env().runner_env))
    h: Harness = make_harness(local, policy=allowed)
    h.mention(f"```yaml\n{text}```", user=MEMBER)
    emulator.wait_for(lambda: h.store.list_runs())
    h.settle(h.store.list_runs()[0]["id"], timeout=120)
    assert marker.read_text() == "ran on the bot host"
    assert h.store.refusals() == []


def test_inputs_outside_the_roots_are_neither_read_nor_shown(tmp_path: Path,
                                                             emulator: SlackEmulator,
                                                             make_harness: Any) -> None:
    token = f"tok{secrets.token_hex(12)}"
    secret_dir = tmp_path / "host-secrets"
    secret_dir.mkdir()
    (secret_dir / f"{token}.txt").write_text(f"password={token}\n")
    text = project(tmp_path).replace("  dir: data/pilote\n", f"  dir: {secret_dir}\n").replace(
        'pattern: "doc-*.txt"', 'pattern: "*.txt"').replace("expected_count: 12",
                                                            "expected_count: 1").replace(
        "expected_refusals: [doc-07]", f"expected_refusals: [{token}.txt]")
    # The control: a policy whose roots hold that directory answers with the file's name.
    h: Harness = make_harness(ReplayDispatcher(), policy=team_policy(tmp_path))
    ts, _ = h.mention(f"```yaml\n{text}```", user=MEMBER)
    emulator.wait_for(lambda: leaked(emulator, f"did you mean '{token}'"))
    h.service.guard.policy = strict(tmp_path, "nodes: [local]\n")
    emulator.calls.clear()
    ts, _ = h.mention(f"```yaml\n{text}```", user=MEMBER)
    note = refused_in_thread(h, emulator, ts, MEMBER)
    assert "rule `project_roots`" in note and "inputs.dir (line" in note
    # A link inside the roots leading out of them is refused too.
    link_dir = tmp_path / "projects" / "proj" / "data" / "pilote"
    (link_dir / "doc-12.txt").unlink()
    (link_dir / "doc-12.txt").symlink_to(secret_dir / f"{token}.txt")
    ts, _ = h.mention(f"```yaml\n{project_text(tmp_path)}```", user=MEMBER)
    note = refused_in_thread(h, emulator, ts, MEMBER)
    assert "'doc-12.txt' is a link" in note
    assert not leaked(emulator, token)
    assert h.store.list_runs() == [] and h.dispatcher.started == []  # type: ignore[attr-defined]
    (link_dir / "doc-12.txt").unlink()
    (link_dir / "doc-12.txt").write_text("document 12\n")
    h.mention(f"```yaml\n{project_text(tmp_path)}```", user=MEMBER)
    emulator.wait_for(lambda: h.store.list_runs())
    assert h.settle(h.store.list_runs()[0]["id"])["outcome"] == "passed"


def project_text(root: Path) -> str:
    return (root / "projects" / "manifests" / "pilote.yaml").read_text().replace(
        "  dir: ../proj\n", "  dir: ../projects/proj\n")


def test_self_approval_through_the_manifest_is_refused(tmp_path: Path,
                                                       emulator: SlackEmulator,
                                                       make_harness: Any) -> None:
    forced = team_policy(tmp_path, "roles:\n  approvers: [U0APPROVER, U0MEMBER]\n"
                                   "nodes: [local]\napprovals: {two_person: true}\n")
    h: Harness = make_harness(ReplayDispatcher(), policy=forced)
    ts, _ = h.mention(f"```yaml\n{project(tmp_path, approvers=(MEMBER, 'U0FRIEND'))}```",
                      user=MEMBER)
    note = refused_in_thread(h, emulator, ts, MEMBER)
    assert "approvals.approvers[1] (line" in note and "'U0FRIEND'" in note
    assert "policy.yaml line 2 (roles.approvers)" in note
    assert h.store.list_runs() == []
    # Naming nobody: the policy's approvers; two_person forced on by the policy.
    text = project_text(tmp_path).replace("approvers: [U0MEMBER, U0FRIEND]", "approvers: []")
    ts, _ = h.mention(f"```yaml\n{text}```", user=MEMBER)
    emulator.wait_for(lambda: h.store.list_runs())
    run = h.settle(h.store.list_runs()[0]["id"])
    assert run["approvers"] == [APPROVER, MEMBER] and run["two_person"] == 1
    for user in (MEMBER, "U0STRANGER"):
        h.mention("approve looks fine", user=user, thread_ts=ts)
        emulator.wait_for(lambda u=user: [d for d in h.store.decisions(run["id"]) if d["by"] == u])
    assert [d["accepted"] for d in h.store.decisions(run["id"])] == [0, 0]
    assert "two-person" in h.store.decisions(run["id"])[0]["refusal"]
    h.mention("approve balance reviewed", user=APPROVER, thread_ts=ts)
    assert h.decided(run["id"])["status"] == "decided"


def test_lease_moves_need_an_operator_and_a_second_person(tmp_path: Path,
                                                          emulator: SlackEmulator,
                                                          make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher(), policy=strict(tmp_path))
    _, body = h.command("lease gpu-1.example ordered", user=MEMBER)
    assert "Refused by the bot's policy" in body and "roles.lease_operators" in body
    assert h.store.current_lease("gpu-1.example") is None
    emulator.wait_for(lambda: [m for m in emulator.messages.values()
                               if "refused by the bot's policy" in m.text])
    _, body = h.command("lease gpu-1.example ordered", user=OPERATOR)
    assert "now *ordered*" in body
    # The operator's own two-person pilot waits on the node: someone else confirms funds.
    text = project(tmp_path, two_person=True).replace(
        "node:\n  kind: local\n", "node:\n  kind: ssh\n  host: gpu-1.example\n")
    loaded = load_manifest(text, source="test", base_dir=tmp_path / "manifests")
    h.service.submit(loaded, submitter=OPERATOR)
    _, body = h.command("lease gpu-1.example payment-notified", user=OPERATOR)
    assert "now *payment-notified*" in body
    _, body = h.command("lease gpu-1.example funds-confirmed", user=OPERATOR)
    assert "approvals.two_person" in body
    lease = h.store.current_lease("gpu-1.example")
    assert lease is not None and lease["state"] == "payment-notified"
    assert [(c["to_state"], c["by"]) for c in h.store.lease_changes(int(lease["id"]))] == [
        ("ordered", f"<@{OPERATOR}>"), ("payment-notified", f"<@{OPERATOR}>")]
    assert [(r["who"], r["rule"]) for r in h.store.refusals()] == [
        (OPERATOR, "approvals.two_person"), (MEMBER, "roles.lease_operators")]


def test_a_role_given_to_a_user_group(tmp_path: Path, emulator: SlackEmulator,
                                      make_harness: Any) -> None:
    emulator.usergroups["S0PILOTS"] = [MEMBER]
    team = team_policy(tmp_path, "roles: {submitters: [S0PILOTS], approvers: [U0APPROVER]}\n"
                                 "nodes: [local]\n")
    h: Harness = make_harness(ReplayDispatcher(), policy=team)
    text = project(tmp_path)
    ts, _ = h.mention(f"```yaml\n{text}```", user="U0STRANGER")
    assert "rule `roles.submitters`" in refused_in_thread(h, emulator, ts, "U0STRANGER")
    h.mention(f"```yaml\n{text}```", user=MEMBER)
    emulator.wait_for(lambda: h.store.list_runs())
    assert h.settle(h.store.list_runs()[0]["id"])["submitter"] == MEMBER


def test_what_the_bot_posts_passes_the_secret_scanner(tmp_path: Path, emulator: SlackEmulator,
                                                      make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    github = "ghp_" + "x1" * 18
    h.bot.handlers.post(CHANNEL, None, f"a traceback said {github}",
                        [{"type": "section", "text": {"type": "mrkdwn", "text": github}}])
    assert not leaked(emulator, github)
    posted = emulator.calls_to("chat.postMessage")[-1].params
    assert "[redacted: a GitHub token]" in json.dumps(posted)


def test_a_broken_policy_file_stops_the_bot(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("roles:\n  approvers: [U0A]\n  aprovers: [U0B]\n")
    done = subprocess.run([sys.executable, "-m", "bot", "serve", "--http", "--port", "0"],
                          cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "roles.aprovers (line 3" in done.stderr and "unknown key" in done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stdout
    missing = subprocess.run([sys.executable, "-m", "bot", "serve", "--http"], cwd=tmp_path,
                             env=env_for(tmp_path, PREFLIGHT_POLICY=str(tmp_path / "no.yaml")),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "cannot read the policy file" in missing.stderr
