"""The bot's policy: the file read with line numbers, and each rule as a pure check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.errors import PolicyError
from bot.manifest.secrets import redact_secrets
from bot.manifest.source import parse_text
from bot.policy import Identity, Policy, checks, default_policy, load_policy, policy_for
from bot.settings import Settings
from tests.bot.manifest_helpers import dump, merged
from tests.bot.runs import run_of

REPO = Path(__file__).resolve().parents[2]
MEMBER, LEAD, ADMIN = Identity("U0MEMBER"), Identity("U0LEAD"), Identity("U0ADMIN")


def policy(tmp_path: Path, text: str) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return load_policy(path, home=tmp_path)


def submission(p: Policy, data: dict[str, Any], base: Path, *, origin: str = "slack",
               who: Identity = MEMBER) -> list[checks.Refusal]:
    parsed, marks = parse_text(dump(data))
    return checks.check_submission(p, parsed, marks, origin=origin,  # type: ignore[arg-type]
                                   who=who, base_dir=base)


def test_the_shipped_example_loads_and_every_rule_names_its_line() -> None:
    p = load_policy(REPO / "docs" / "policy.example.yaml", home=Path("/srv/preflight"))
    assert p.file.roles.approvers == ["U012LEAD001", "U012LEAD002"]
    assert p.where("roles.approvers").endswith("policy.example.yaml line 15 (roles.approvers)")
    assert p.roots == (Path("/srv/preflight/shared"),)
    assert p.roots_for("C012TEAMA01")[0] == (Path("/srv/preflight/projects/team-a"),
                                             Path("/srv/preflight/shared"))
    assert p.warnings and "S0PILOTTEAM" in p.warnings[0]
    assert "not set" in p.where("roles.nonexistent")


@pytest.mark.parametrize(("text", "line", "words"), [
    ("roles:\n  approvers: [U0LEAD]\n  aprovers: [U0X]\n", 3, "unknown key 'aprovers'"),
    ("roles:\n  admins:\n    - U0ADMIN\n    - alice\n", 4, "'alice' is not a Slack id"),
    ("project_roots: [projects]\n", 1, "not an absolute path"),
    ("nodes: [gpu-1:70000]\n", 1, "port"),
    ("spending:\n  max_lots: yes\n", 2, "spending.max_lots"),
    ("roles: [a\n", 2, "not valid YAML"),
])
def test_a_broken_policy_is_refused_naming_the_line(tmp_path: Path, text: str, line: int,
                                                    words: str) -> None:
    with pytest.raises(PolicyError) as caught:
        policy(tmp_path, text)
    problem = caught.value.problems[0]
    assert problem.line == line, caught.value
    assert words in str(caught.value)
    assert caught.value.exit_code == 2


def test_defaults_without_a_file_and_an_explicit_missing_file(tmp_path: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    p = policy_for(settings)
    assert not p.from_file and p.roots == ((tmp_path / "projects").resolve(),)
    assert "built-in default of nodes" in p.where("nodes")
    explicit = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path),
                                  "PREFLIGHT_POLICY": str(tmp_path / "nope.yaml")})
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        policy_for(explicit)


def slack_project(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    project = tmp_path / "projects" / "team"
    (project / "data" / "pilote").mkdir(parents=True)
    return tmp_path / "projects", merged(project={"dir": "team"})


def test_slack_defaults_refuse_local_and_commands(tmp_path: Path) -> None:
    base, data = slack_project(tmp_path)
    p = default_policy(tmp_path)
    refusals = submission(p, data, base)
    assert [r.rule for r in refusals] == ["nodes"]
    assert "bot host" in refusals[0].message and "built-in default" in refusals[0].where
    allowed = policy(tmp_path, "nodes: [local]\n")
    assert submission(allowed, data, base) == []
    command = merged(project={"dir": "team"}, task={"handler": None, "command": "touch x"})
    refusals = submission(allowed, command, base)
    assert [r.rule for r in refusals] == ["task_command.local"]
    assert "task.command (line" in refusals[0].message
    assert submission(policy(tmp_path, "nodes: [local]\ntask_command: {local: true}\n"),
                      command, base) == []
    assert submission(default_policy(tmp_path), command, base, origin="cli") == []


def test_ssh_nodes_and_their_commands(tmp_path: Path) -> None:
    base, _ = slack_project(tmp_path)
    node = {"kind": "ssh", "host": "GPU-1.example.net", "port": 2222, "user": "gpu"}
    data = merged(project={"dir": "team"}, node=node,
                  task={"handler": None, "command": ["run.sh"]})
    p = policy(tmp_path, "nodes: [gpu@gpu-1.example.net:2222]\n")
    assert submission(p, data, base) == []
    other = policy(tmp_path, "nodes: [root@gpu-1.example.net:2222, gpu-1.example.net]\n")
    assert [r.rule for r in submission(other, data, base)] == ["nodes", "task_command.ssh"]
    unset = default_policy(tmp_path)  # any SSH node; a command only on a listed one
    assert [r.rule for r in submission(unset, data, base)] == ["task_command.ssh"]


def test_a_blender_executable_named_from_slack_is_an_external_command(tmp_path: Path) -> None:
    base, _ = slack_project(tmp_path)
    allowed = policy(tmp_path, "nodes: [local]\n")
    on_path = merged(project={"dir": "team"}, preparation="blender",
                     blender={"executable": "blender"})
    assert submission(allowed, on_path, base) == []
    named = merged(project={"dir": "team"}, preparation="blender",
                   blender={"executable": "/tmp/x/blender"})
    refusals = submission(allowed, named, base)
    assert [r.rule for r in refusals] == ["task_command.local"]
    assert "blender.executable (line" in refusals[0].message
    assert submission(allowed, named, base, origin="cli") == []


def test_manifest_approvers_only_narrow_the_policy(tmp_path: Path) -> None:
    base, _ = slack_project(tmp_path)
    p = policy(tmp_path, "nodes: [local]\nroles: {approvers: [U0LEAD], admins: [U0ADMIN]}\n")
    data = merged(project={"dir": "team"}, approvals={"approvers": ["U0LEAD", "U0MEMBER"]})
    refusals = submission(p, data, base)
    assert [r.rule for r in refusals] == ["roles.approvers"]
    assert "approvals.approvers[1] (line" in refusals[0].message
    assert "'U0MEMBER'" in refusals[0].message and "line 2 (roles.approvers)" in refusals[0].where
    assert checks.effective_approvers(p, ["U0LEAD"], "slack") == ["U0LEAD"]
    assert checks.effective_approvers(p, [], "slack") == ["U0ADMIN", "U0LEAD"]
    assert checks.effective_approvers(p, ["alice"], "cli") == ["alice"]
    forced = policy(tmp_path, "approvals: {two_person: true}\n")
    assert checks.two_person(forced, False) and not checks.two_person(p, False)


def test_paths_must_resolve_inside_the_roots(tmp_path: Path) -> None:
    base, _ = slack_project(tmp_path)
    outside = tmp_path / "secrets"
    outside.mkdir()
    (base / "team" / "escape").symlink_to(outside)
    p = policy(tmp_path, "nodes: [local]\n")
    for section in ({"inputs": {"dir": "../../secrets"}}, {"inputs": {"dir": "escape"}},
                    {"inputs": {"dir": str(outside)}}, {"results": {"copy_to": "/etc/x"}},
                    {"results": {"runs_dir": "../.."}}, {"project": {"dir": "/"}}):
        data = merged(project={"dir": "team"})
        for key, value in section.items():
            data[key] = {**data.get(key, {}), **value}
        refusals = submission(p, data, base)
        assert {r.rule for r in refusals} == {"project_roots"}, section
    link = base / "team" / "data" / "pilote" / "doc-01.txt"
    link.symlink_to(outside / "id_rsa")
    refusals = checks.check_files(p, [link], "input file")
    assert refusals and "'doc-01.txt' is a link" in refusals[0].message
    assert str(outside) not in refusals[0].message  # where a link leads is not told
    ok = merged(project={"dir": "team"}, results={"copy_to": "s3://bucket/evidence"})
    assert submission(p, ok, base) == []


def test_cli_reads_stay_in_the_manifest_and_project_tree(tmp_path: Path) -> None:
    manifests = tmp_path / "repo" / "manifests"
    manifests.mkdir(parents=True)
    p = default_policy(tmp_path)
    demo = merged(project={"dir": ".."}, results={"copy_to": "/srv/evidence"})
    assert submission(p, demo, manifests, origin="cli") == []  # the shipped demo's layout
    away = merged(project={"dir": ".."}, inputs={"dir": "/etc"})
    refusals = submission(p, away, manifests, origin="cli")
    assert [r.rule for r in refusals] == ["project_roots"] and "CLI" in refusals[0].where


def test_submitters_approvals_caps_and_leases(tmp_path: Path) -> None:
    p = policy(tmp_path, "roles:\n  submitters: [S0TEAM]\n  approvers: [U0LEAD]\n"
                         "  admins: [U0ADMIN]\n  lease_operators: [U0OPS]\n"
                         "spending: {max_lots: 2, max_total_usd: 100}\n")
    assert not checks.holds(p, "submitters", MEMBER)
    assert checks.holds(p, "submitters", Identity("U0MEMBER", frozenset({"S0TEAM"})))
    small = run_of(plan={"lots": 1, "days": 3, "total_usd": "30.00"})
    big = run_of(plan={"lots": 4, "days": 3, "total_usd": "30.00"})
    assert [r.rule for r in checks.check_approval(p, small, MEMBER, "slack")] == [
        "roles.approvers"]
    assert checks.check_approval(p, small, LEAD, "slack") == []
    refused = checks.check_approval(p, big, LEAD, "slack")
    assert [r.rule for r in refused] == ["spending.max_lots"] and "admin" in refused[0].message
    assert checks.check_approval(p, big, ADMIN, "slack") == []
    assert checks.check_approval(p, big, MEMBER, "cli") == []
    assert [r.rule for r in checks.check_lease_change(p, MEMBER, "slack", "ordered", [])] == [
        "roles.lease_operators"]
    ops = Identity("U0OPS")
    waiting = [run_of(id="run-1", submitter="U0OPS", two_person=1)]
    assert checks.check_lease_change(p, ops, "slack", "payment-notified", waiting) == []
    refused = checks.check_lease_change(p, ops, "slack", "provisioned", waiting)
    assert [r.rule for r in refused] == ["approvals.two_person"]
    assert "manifest of run run-1" in refused[0].where
    assert checks.check_lease_change(p, ADMIN, "slack", "provisioned", waiting) == []


def test_secrets_are_redacted_from_outgoing_text() -> None:
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----"
    text = f"token xoxb-12345-abcdef and ghp_{'a' * 36} and\n{key}\nbye"
    out = redact_secrets(text)
    assert "xoxb-12345" not in out and "ghp_" not in out and "b3BlbnNzaC1rZXk" not in out
    assert out.endswith("bye") and "[redacted: key material]" in out


def test_a_config_link_out_of_the_roots_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from bot.errors import PolicyRefused
    from bot.manifest.load import load_manifest
    from bot.policy.guard import PolicyGuard
    from bot.store import Store
    from tests.bot.manifest_helpers import make_project

    base, _ = slack_project(tmp_path)
    make_project(base / "team")
    (base / "team" / "config").mkdir()
    (base / "team" / "config" / "params.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    text = dump(merged(project={"dir": "team"}))
    guard = PolicyGuard(policy(tmp_path, "nodes: [local]\n"), Store(tmp_path / "db.sqlite"))
    guard.screen(text, source="t", base_dir=base, user="U0MEMBER", origin="slack")
    loaded = load_manifest(text, source="t", base_dir=base)
    with pytest.raises(PolicyRefused, match="'params.yaml' is a link"):
        guard.check_files(loaded, user="U0MEMBER", origin="slack")
    guard.check_files(loaded, user="U0MEMBER", origin="cli")  # the terminal: not checked
    assert [r["rule"] for r in guard.store.refusals()] == ["project_roots"]  # type: ignore[attr-defined]


def test_odd_values_are_refused_not_crashed_on(tmp_path: Path) -> None:
    base, _ = slack_project(tmp_path)
    (base / "team" / "loop").symlink_to(base / "team" / "loop")
    p = policy(tmp_path, "nodes: [gpu-1.example]\n")
    for section in ({"inputs": {"dir": "data\x00/pilote"}}, {"inputs": {"dir": "loop/x"}}):
        data = merged(project={"dir": "team"}, **section)
        refusals = submission(p, data, base)
        assert [r.rule for r in refusals] == ["nodes", "project_roots"], section
        assert "cannot be resolved" in refusals[1].message
    odd = merged(project={"dir": "team"}, node={"kind": "ssh", "host": "gpu-1.example",
                                                "user": 5, "port": "x"})
    assert submission(p, odd, base) == []  # the manifest's own validation refuses it
    assert checks.check_files(p, [base / "team" / "loop"], "file")


# -- every node a run may use, host-key pins, roots per team, acting on a run ------------
PIN = "SHA256:" + "A" * 43
LISTED = {"kind": "ssh", "host": "gpu-1.example.net", "port": 2222, "user": "gpu"}


def test_every_volume_node_passes_the_node_and_command_checks(tmp_path: Path) -> None:
    base, _ = slack_project(tmp_path)
    p = policy(tmp_path, "nodes: [gpu@gpu-1.example.net:2222]\n")
    command = {"handler": None, "command": ["run.sh"]}
    # The attack: the pilot names the allowed node, the volume the bot host.
    bot_host = merged(project={"dir": "team"}, node=LISTED, task=command,
                      volume={"inputs": {"dir": "data", "expected_count": 1},
                              "nodes": [{"kind": "local"}]})
    refusals = submission(p, bot_host, base)
    assert [r.rule for r in refusals] == ["nodes", "task_command.local"]
    assert refusals[0].message.startswith("volume.nodes[0].kind (line")
    assert "(volume.nodes[0])" in refusals[1].message
    handler = merged(project={"dir": "team"}, node=LISTED,
                     volume={"inputs": {"dir": "data", "expected_count": 1},
                             "nodes": [{"kind": "local"}]})
    assert [r.rule for r in submission(p, handler, base)] == ["nodes"]  # project code too
    unlisted = merged(project={"dir": "team"}, node=LISTED, task=command,
                      volume={"inputs": {"dir": "data", "expected_count": 1},
                              "nodes": [LISTED, {**LISTED, "host": "elsewhere.example"}]})
    refusals = submission(p, unlisted, base)
    assert [r.rule for r in refusals] == ["nodes", "task_command.ssh"]
    assert refusals[0].message.startswith("volume.nodes[1].host (line")
    assert "elsewhere.example:2222" in refusals[0].message
    # The same manifest is allowed where the policy lists every node it uses.
    both = policy(tmp_path, "nodes: [gpu@gpu-1.example.net:2222, elsewhere.example:2222]\n")
    assert submission(both, unlisted, base) == []
    local = policy(tmp_path, "nodes: [gpu@gpu-1.example.net:2222, local]\n"
                             "task_command: {local: true}\n")
    assert submission(local, bot_host, base) == []
    assert submission(p, bot_host, base, origin="cli") == []  # the terminal: not its business


def test_a_host_key_pin_from_slack_must_be_the_policys(tmp_path: Path) -> None:
    base, _ = slack_project(tmp_path)
    data = merged(project={"dir": "team"}, node={**LISTED, "host_key_fingerprint": PIN})
    refusals = submission(policy(tmp_path, "nodes: [gpu@gpu-1.example.net:2222]\n"), data, base)
    assert [r.rule for r in refusals] == ["nodes"]
    assert refusals[0].message.startswith("node.host_key_fingerprint (line")
    assert [r.rule for r in submission(default_policy(tmp_path), data, base)] == ["nodes"]
    other = "SHA256:" + "B" * 43
    pinned = policy(tmp_path, f"nodes: ['gpu@gpu-1.example.net:2222 {other}']\n")
    assert [r.rule for r in submission(pinned, data, base)] == ["nodes"]
    same = policy(tmp_path, f"nodes: ['gpu@gpu-1.example.net:2222 {PIN}']\n")
    assert submission(same, data, base) == []
    assert submission(default_policy(tmp_path), data, base, origin="cli") == []
    volume = merged(project={"dir": "team"}, node=LISTED,
                    volume={"inputs": {"dir": "data", "expected_count": 1},
                            "nodes": [{**LISTED, "host_key_fingerprint": other}]})
    refusals = submission(same, volume, base)
    assert [r.rule for r in refusals] == ["nodes"]
    assert refusals[0].message.startswith("volume.nodes[0].host_key_fingerprint (line")
    with pytest.raises(PolicyError, match="SHA256"):
        policy(tmp_path, "nodes: ['gpu-1.example.net SHA1:xyz']\n")


def test_team_roots_keep_each_team_in_its_own_projects(tmp_path: Path) -> None:
    projects = tmp_path / "projects"
    for team in ("a", "b", "shared"):
        (projects / team / "data").mkdir(parents=True)
    p = policy(tmp_path, f"nodes: [local]\nproject_roots: [{projects}/shared]\n"
                         "team_roots:\n"
                         f"  - channels: [C0TEAMA]\n    roots: [{projects}/a]\n"
                         f"  - groups: [S0TEAMB]\n    roots: [{projects}/b]\n"
                         "    shared: true\n")
    team_a = Identity("U0MEMBER", channel="C0TEAMA")
    team_b = Identity("U0MEMBER", frozenset({"S0TEAMB"}), channel="C0OTHER")

    def rules(project: str, who: Identity) -> list[str]:  # project.dir and inputs.dir
        return sorted({r.rule for r in submission(p, merged(project={"dir": project}),
                                                  projects, who=who)})

    assert rules("a", team_a) == []
    refusals = submission(p, merged(project={"dir": "b"}), projects, who=team_a)
    assert {r.rule for r in refusals} == {"team_roots"}
    assert "project.dir (line" in refusals[0].message and "line 4 (team_roots.0)" in \
        refusals[0].where
    assert rules("shared", team_a) == ["team_roots"]  # not shared with team A
    assert rules("b", team_b) == [] and rules("shared", team_b) == []
    assert rules("a", team_b) == ["team_roots"]
    nobody = Identity("U0MEMBER", channel="C0ELSE")  # no team: the global project_roots
    assert rules("shared", nobody) == [] and rules("a", nobody) == ["project_roots"]
    link = projects / "a" / "data" / "x.txt"
    link.symlink_to(projects / "b" / "data" / "y.txt")
    assert [r.rule for r in checks.check_files(p, [link], "file", team_a)] == ["team_roots"]
    assert checks.check_files(p, [link], "file", team_b) == []  # it leads into b's root
    for text, words in (("team_roots:\n  - roots: [/srv/a]\n", "name the channels"),
                        ("team_roots:\n  - channels: [C0A]\n    roots: [/srv/a]\n    x: 1\n",
                         "unknown key 'x'"),
                        ("team_roots:\n  - channels: [U0A]\n    roots: [/srv/a]\n", "U0A"),
                        ("team_roots:\n  - channels: [C0A]\n    roots: [a]\n", "absolute")):
        with pytest.raises(PolicyError, match=words):
            policy(tmp_path, text)


def test_acting_on_a_run_needs_its_channel_and_a_role(tmp_path: Path) -> None:
    p = policy(tmp_path, "roles: {approvers: [U0LEAD], admins: [U0ADMIN]}\n")
    run = run_of(id="run-1", channel="C0TEAM", submitter="U0OWNER", approvers=["U0RUNAPP"])

    def rules(user: str, action: str, channel: str | None = "C0TEAM",
              origin: str = "slack") -> list[str]:
        who = Identity(user, channel=channel)
        return [r.rule for r in checks.check_run_action(p, run, who, origin,  # type: ignore[arg-type]
                                                        action)]

    for action in ("stop", "revise", "fix-env"):
        assert rules("U0MEMBER", action) == ["roles.approvers"]
        assert all(rules(u, action) == [] for u in ("U0OWNER", "U0LEAD", "U0ADMIN", "U0RUNAPP"))
        assert rules("U0OWNER", action, "C0ELSE") == ["channel"]
        assert rules("U0MEMBER", action, None, "cli") == []  # the terminal's --by
    assert rules("U0MEMBER", "approve") == []  # approve: check_decision and check_approval
    assert rules("U0LEAD", "approve", "C0ELSE") == ["channel"]
    refusal = checks.check_run_action(p, run, Identity("U0MEMBER", channel="C0TEAM"), "slack",
                                      "stop")[0]
    assert "only its submitter <@U0OWNER>, an approver or an admin" in refusal.message
    assert "line 1 (roles.approvers)" in refusal.where


def test_roles_held_through_a_user_group_warn_at_start(tmp_path: Path) -> None:
    p = policy(tmp_path, "roles:\n  approvers: [U0LEAD, S0LEADS]\n  admins: [U0ADMIN]\n")
    assert len(p.warnings) == 1
    assert "roles.approvers names Slack user group(s) S0LEADS" in p.warnings[0]
    assert "line 2" in p.warnings[0]
    assert policy(tmp_path, "roles: {approvers: [U0LEAD]}\n").warnings == []
    assert default_policy(tmp_path).warnings == []
