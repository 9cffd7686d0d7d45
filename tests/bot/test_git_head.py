"""The project's git commit is read only from inside its own .git (issue 24, item 3)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from bot.manifest.git_head import git_commit
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest

CANARY = "c0ffee" + "e" * 34  # commit-shaped, so only where it was read from can stop it


def checkout(root: Path, head: str) -> Path:
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(head + "\n")
    (git / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    return git


def canary(tmp_path: Path) -> Path:
    path = tmp_path / "home" / "bot" / ".ssh" / "id_ed25519"
    path.parent.mkdir(parents=True)
    path.write_text(CANARY + "\n")
    return path


def test_a_plain_checkout_and_packed_refs_still_give_the_commit(tmp_path: Path) -> None:
    git = checkout(tmp_path / "p", "ref: refs/heads/main")
    assert git_commit(tmp_path / "p") == "a" * 40
    (git / "refs" / "heads" / "main").unlink()
    (git / "packed-refs").write_text(f"# pack-refs\n{'b' * 40} refs/heads/main\n")
    assert git_commit(tmp_path / "p") == "b" * 40
    (git / "HEAD").write_text("d" * 40 + "\n")  # detached
    assert git_commit(tmp_path / "p") == "d" * 40


@pytest.mark.parametrize("ref", ["ref: ../../home/bot/.ssh/id_ed25519",
                                 "ref: refs/../../../home/bot/.ssh/id_ed25519",
                                 "ref: {canary}"])
def test_a_ref_leading_out_of_git_is_never_read(tmp_path: Path, ref: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    secret = canary(tmp_path)
    checkout(tmp_path / "p", ref.format(canary=secret))
    with caplog.at_level(logging.WARNING):
        assert git_commit(tmp_path / "p") is None
    assert "not a refs/" in caplog.text


def test_a_ref_that_is_a_symlink_out_is_never_read(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    secret = canary(tmp_path)
    git = checkout(tmp_path / "p", "ref: refs/heads/main")
    (git / "refs" / "heads" / "main").unlink()
    (git / "refs" / "heads" / "main").symlink_to(secret)
    with caplog.at_level(logging.WARNING):
        assert git_commit(tmp_path / "p") is None
    assert "outside" in caplog.text
    (git / "refs" / "heads" / "main").unlink()  # a folder of refs that is a link out
    os.rename(git / "refs" / "heads", git / "refs" / "old")
    (git / "refs" / "heads").symlink_to(secret.parent)
    (git / "HEAD").write_text("ref: refs/heads/id_ed25519\n")
    assert git_commit(tmp_path / "p") is None
    (git / "HEAD").unlink()
    (git / "HEAD").symlink_to(secret)
    assert git_commit(tmp_path / "p") is None


def test_packed_refs_and_commondir_leading_out_are_never_read(tmp_path: Path) -> None:
    secret = canary(tmp_path)
    secret.with_name("packed-refs").write_text(f"{CANARY} refs/heads/main\n")
    git = checkout(tmp_path / "p", "ref: refs/heads/main")
    (git / "refs" / "heads" / "main").unlink()
    (git / "packed-refs").symlink_to(secret.with_name("packed-refs"))
    assert git_commit(tmp_path / "p") is None
    (git / "packed-refs").unlink()
    (git / "commondir").write_text(os.path.relpath(secret.parent, git) + "\n")
    assert git_commit(tmp_path / "p") is None


def test_a_git_file_or_link_pointing_elsewhere_is_never_followed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = canary(tmp_path)
    (secret.parent / "HEAD").write_text(CANARY + "\n")
    project = tmp_path / "p"
    project.mkdir()
    (project / ".git").write_text(f"gitdir: {secret.parent}\n")
    with caplog.at_level(logging.WARNING):
        assert git_commit(project) is None
    assert "outside the project's .git" in caplog.text
    (project / ".git").unlink()
    (project / ".git").symlink_to(secret.parent)
    assert git_commit(project) is None
    (project / ".git").unlink()  # a submodule's gitdir inside the parent's .git is fine
    outer = checkout(tmp_path, "ref: refs/heads/main")
    (outer / "modules" / "p").mkdir(parents=True)
    (outer / "modules" / "p" / "HEAD").write_text("f" * 40 + "\n")
    (project / ".git").write_text("gitdir: ../.git/modules/p\n")
    assert git_commit(project) == "f" * 40


def test_a_head_that_is_not_a_commit_is_not_passed_on(tmp_path: Path) -> None:
    git = checkout(tmp_path / "p", "ref: refs/heads/main")
    (git / "refs" / "heads" / "main").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert git_commit(tmp_path / "p") is None


def test_the_canary_never_reaches_the_spec_or_the_run_record(tmp_path: Path) -> None:
    secret = canary(tmp_path)
    project = tmp_path / "p"
    project.mkdir()
    checkout(project, "ref: " + os.path.relpath(secret, project / ".git"))
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path / "bothome")})
    service = PilotService(settings, Store(settings.db_path), {"local": ScriptedDispatcher(
        lambda run: pilot_script(["doc-01"], refuse=()))}, RecordingNotifier())
    sub = service.submit(load_manifest_file(write_manifest(project, count=1)), submitter="bob")
    run_dir = Path(service.store.get_run(sub.run_id)["run_dir"])
    assert json.loads((run_dir / "spec.json").read_text())["project"]["commit"] is None
    for path in [settings.db_path, *run_dir.rglob("*")]:
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path
