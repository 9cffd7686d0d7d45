"""inputs.dir is checked again at dispatch and only what was checked is sent (issue 24,
item 8): a run waiting for its lease whose inputs folder (or a file in it) is swapped for a
link to the bot's ~/.ssh is refused, and the keys are never read."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import runner
from bot.dispatch.base import RunHandle
from bot.dispatch.inputs_check import recheck_inputs, record_inputs
from bot.dispatch.upload import UploadPlan
from bot.errors import DispatchError
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.nodes.local import LocalDispatcher
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import write_manifest

CANARY = "CANARY-ssh-private-key-9f3c1d"
PACKAGE = Path(runner.__file__).resolve().parent


def canary_ssh(tmp_path: Path) -> Path:
    """The bot user's ~/.ssh, with a key named like an input so the pattern would take it."""
    ssh = tmp_path / "bot-home" / ".ssh"
    ssh.mkdir(parents=True)
    for name in ("id_ed25519", "doc-01.txt", "doc-09.txt"):
        (ssh / name).write_text(CANARY + "\n")
    return ssh


def swap_for_link(folder: Path, target: Path) -> None:
    folder.rename(folder.with_name(folder.name + ".orig"))
    folder.symlink_to(target)


def no_canary_under(*roots: Path) -> None:
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert CANARY.encode() not in path.read_bytes(), path


def test_a_folder_swapped_for_a_link_before_dispatch_is_refused(tmp_path: Path) -> None:
    ssh = canary_ssh(tmp_path)
    project = tmp_path / "project"
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path / "state-home")})
    service = PilotService(settings, Store(settings.db_path),
                           {"local": LocalDispatcher(sys.executable, env={})},
                           RecordingNotifier())
    sub = service.submit(load_manifest_file(write_manifest(project)), submitter="bob")
    swap_for_link(project / "data" / "pilote", ssh)  # while the run waits for its lease
    with pytest.raises(DispatchError) as info:
        service.starter.start(sub.run_id)
    message = str(info.value)
    assert "inputs.dir" in message and "no longer resolves" in message
    assert str(ssh) not in message  # where the link leads is not told
    run = service.store.get_run(sub.run_id)
    assert run["status"] == "dispatch_failed"
    assert not (Path(run["run_dir"]) / "runner.log").exists()  # no runner started
    no_canary_under(Path(run["run_dir"]), settings.db_path)


def checked(tmp_path: Path) -> tuple[Path, Path, dict[str, object]]:
    """A run whose inputs live outside its project (sent as a tree of their own), recorded
    as they were checked at submission."""
    project, inputs, run_dir = (tmp_path / n for n in ("project", "shared-inputs", "runs/r1"))
    for folder in (project, inputs, run_dir):
        folder.mkdir(parents=True)
    for n in range(1, 5):
        (inputs / f"doc-0{n}.txt").write_text(f"invoice {n}\n")
    spec: dict[str, object] = {"project": {"dir": str(project)},
                               "inputs": {"dir": str(inputs), "pattern": "doc-*.txt"}}
    record_inputs(run_dir, str(inputs), "doc-*.txt")
    return inputs, run_dir, spec


def plan(run_dir: Path, spec: dict[str, object]) -> UploadPlan:
    project = run_dir.parents[1] / "project"
    return UploadPlan("/w", RunHandle("r1", run_dir, run_dir / "spec.json", project),
                      PACKAGE, spec)


def sent_inputs(upload: UploadPlan) -> dict[str, Path]:
    (tree,) = [local for _kind, root, local in upload.trees() if "/inputs/" in root]
    return {rel: path for rel, (path, _digest) in tree.items()}


def test_exactly_the_checked_files_are_sent(tmp_path: Path) -> None:
    inputs, run_dir, spec = checked(tmp_path)
    (inputs / "notes.md").write_text("not an input\n")
    sent = sent_inputs(plan(run_dir, spec))
    assert sent == {f"doc-0{n}.txt": inputs / f"doc-0{n}.txt" for n in range(1, 5)}


@pytest.mark.parametrize("change, words", [
    ("folder", "no longer resolves"), ("file", "now leads elsewhere"),
    ("added", "was added"), ("removed", "is gone"),
])
def test_a_change_since_the_check_refuses_the_upload(tmp_path: Path, change: str,
                                                     words: str) -> None:
    ssh = canary_ssh(tmp_path)
    inputs, run_dir, spec = checked(tmp_path)
    if change == "folder":
        swap_for_link(inputs, ssh)
    elif change == "file":
        (inputs / "doc-02.txt").unlink()
        (inputs / "doc-02.txt").symlink_to(ssh / "id_ed25519")
    elif change == "added":
        (inputs / "doc-09.txt").symlink_to(ssh / "doc-09.txt")
    else:
        (inputs / "doc-04.txt").unlink()
    with pytest.raises(DispatchError, match=words) as info:
        plan(run_dir, spec)
    assert "inputs.dir" in str(info.value) and str(ssh) not in str(info.value)


def test_a_file_swapped_after_the_check_is_not_read_through_the_link(tmp_path: Path) -> None:
    ssh = canary_ssh(tmp_path)
    inputs, run_dir, spec = checked(tmp_path)
    upload = plan(run_dir, spec)  # checked again here ...
    (inputs / "doc-03.txt").unlink()  # ... and swapped before the files are read
    (inputs / "doc-03.txt").symlink_to(ssh / "id_ed25519")
    with pytest.raises(DispatchError, match="swapped for a link"):
        upload.trees()


def test_a_run_without_a_record_still_refuses_links_leading_out(tmp_path: Path) -> None:
    ssh = canary_ssh(tmp_path)
    inputs, run_dir, spec = checked(tmp_path)
    os.remove(run_dir / "inputs.checked.json")  # submitted before records were kept
    assert len(recheck_inputs(run_dir, spec).files) == 4
    (inputs / "doc-09.txt").symlink_to(ssh / "doc-09.txt")
    with pytest.raises(DispatchError, match="leading out of the folder"):
        recheck_inputs(run_dir, spec)
