"""The policy from the terminal: no policy file needed, the two-person gate on a lease,
and a broken policy file stops the command naming its line."""

from __future__ import annotations

from pathlib import Path

from bot.manifest.load import load_manifest_file
from bot.messages.model import NullNotifier
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.e2e.test_pilot_cli import preflight, project


def test_the_two_person_gate_on_a_lease_from_the_terminal(tmp_path: Path) -> None:
    root = project(tmp_path)
    manifest = root / "manifests" / "pilote.yaml"
    ssh = "node:\n  kind: ssh\n  host: gpu-1.example\n"
    manifest.write_text(manifest.read_text().replace("node:\n  kind: local\n", ssh)
                        .replace("two_person: false", "two_person: true"))
    settings = Settings.from_env({"PREFLIGHT_HOME": str(root)})
    service = PilotService(settings, Store(settings.db_path), {}, NullNotifier())
    service.submit(load_manifest_file(manifest), submitter="alice")  # waits on the lease
    for state in ("ordered", "payment-notified"):
        done = preflight(root, "lease", "set", "gpu-1.example", state, "--by", "alice")
        assert done.returncode == 0, done.stderr
    refused = preflight(root, "lease", "set", "gpu-1.example", "funds-confirmed", "--by", "alice")
    assert refused.returncode == 2 and "approvals.two_person" in refused.stderr
    assert service.store.current_lease("gpu-1.example")["state"] == "payment-notified"
    assert [(r["who"], r["origin"], r["rule"]) for r in service.store.refusals()] == [
        ("alice", "cli", "approvals.two_person")]
    ok = preflight(root, "lease", "set", "gpu-1.example", "funds-confirmed", "--by", "bob")
    assert ok.returncode == 0, ok.stderr


def test_a_broken_policy_file_stops_a_command(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("nodes: [local]\nspending:\n  max_lots: many\n")
    done = preflight(tmp_path, "lease", "set", "gpu-1.example", "ordered", "--by", "alice")
    assert done.returncode == 2
    assert not (tmp_path / "state").exists()  # nothing recorded on a broken policy
    assert "spending.max_lots (line 3" in done.stderr and "Traceback" not in done.stderr
