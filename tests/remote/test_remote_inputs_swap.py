"""A run waiting for its lease whose inputs folder is swapped for a link to the bot's
~/.ssh is refused at dispatch over a real sshd: nothing of the folder reaches the node
(issue 24, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.errors import DispatchError
from tests.remote.remote_kit import provisioned_bot, submit, write_project
from tests.remote.sshd_server import Sshd

CANARY = "CANARY-bot-ssh-key-71be0c"


def test_inputs_swapped_for_a_link_after_submission_never_reach_the_node(
        tmp_path: Path, sshd: Sshd) -> None:
    ssh = tmp_path / "bot-home" / ".ssh"
    ssh.mkdir(parents=True)
    for name in ("id_ed25519", "doc-01.txt", "doc-02.txt"):
        (ssh / name).write_text(CANARY + "\n")
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir))
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = submit(bot, manifest)
        inputs = tmp_path / "project" / "data" / "pilote"
        inputs.rename(inputs.with_name("pilote.checked"))  # while the run waits ...
        inputs.symlink_to(ssh)  # ... its inputs folder becomes a link to the keys
        with pytest.raises(DispatchError, match="inputs.dir .* no longer resolves"):
            bot.service.starter.start(run_id)
        assert bot.store.get_run(run_id)["status"] == "dispatch_failed"
        sent = [p for p in workdir.rglob("*") if p.is_file()] if workdir.exists() else []
        assert all(CANARY.encode() not in p.read_bytes() for p in sent)
        assert not any(p.name == "id_ed25519" for p in sent)
