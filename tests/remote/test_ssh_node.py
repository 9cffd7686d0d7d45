"""The SSH kind's ``Node`` (``bot/nodes/ssh/adapter.py``: one node over the SSH
dispatcher's sessions) against a real sshd: each method of the protocol as the
node-agnostic code asks it, and a pilot that passes when the node-agnostic dispatcher
(``NodeDispatcher``) runs it through that ``Node``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bot.dispatch.node_dispatcher import NodeDispatcher
from bot.dispatch.node_output import NodeOutputTooLarge
from bot.dispatch.upload import RUNNER_PACKAGE
from bot.errors import DispatchError
from bot.manifest.nodes import node_spec
from bot.nodes.ssh.adapter import SSHAdapter
from tests.remote.remote_kit import make_bot, provision, start_run, write_project
from tests.remote.sshd_server import BARE_PYTHON, Sshd


def test_the_ssh_adapter_does_what_a_node_is_asked(tmp_path: Path, sshd: Sshd) -> None:
    dispatcher = sshd.dispatcher()
    spec = node_spec(sshd.node(tmp_path / "work", ray_port=7000))
    assert spec is not None
    node = dispatcher.adapter(spec)
    try:
        assert (node.where, node.host, node.python, node.workdir, node.ray_port) == (
            f"{sshd.user}@127.0.0.1:{sshd.port}", "127.0.0.1", BARE_PYTHON,
            str(tmp_path / "work"), 7000)
        assert node.run("cat; echo; echo err >&2; exit 3", b"from stdin") == (
            3, "from stdin\n", "err\n")
        with pytest.raises(NodeOutputTooLarge, match=node.where):
            node.run("head -c 5000 /dev/zero", cap=4096)
        data = tmp_path / "data.bin"
        data.write_bytes(b"0123456789")
        assert node.read_file(str(data)) == b"0123456789"
        assert node.read_file(str(data), 4, 3) == b"456"
        assert node.read_file(str(data), 20, 3) == b""
        with pytest.raises(FileNotFoundError):
            node.read_file(str(tmp_path / "absent"))
        out = node.send_archive(f"cat > {tmp_path / 'sent'}; echo taken", b"\x00\xffbytes")
        assert out == "taken\n" and (tmp_path / "sent").read_bytes() == b"\x00\xffbytes"
        with pytest.raises(DispatchError, match="the launcher ended with status 2: no"):
            node.send_archive("echo no >&2; exit 2", b"")
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        assert node.probe(None, str(run_dir)) == "starting"  # no pid anywhere yet
        (run_dir / "runner.pid").write_text("999999999\n")
        assert node.probe(None, str(run_dir)) == "dead"
        (run_dir / "exit_code").write_text("0\n")
        assert node.probe(None, str(run_dir)) == "done"
    finally:
        dispatcher.close()


def test_a_pilot_passes_through_the_node_dispatcher_over_ssh(tmp_path: Path,
                                                             sshd: Sshd) -> None:
    """The generic start, follower and fetch, the SSH node as its ``Node``: what moving the
    SSH kind onto ``NodeDispatcher`` builds on (docs/architecture.md)."""
    sessions = sshd.dispatcher()
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir, python=sys.executable))
    generic = NodeDispatcher(lambda spec: SSHAdapter.of(sessions, spec),
                             runner_package=RUNNER_PACKAGE)
    bot = make_bot(tmp_path / "home", sessions)
    bot.service.dispatchers["ssh"] = generic
    try:
        provision(bot.store, sshd.lease_key)
        run_id = start_run(bot, manifest)
        run = bot.service.follower.follow(run_id, timeout=120)
        assert (run["status"], run["outcome"]) == ("awaiting_decision", "passed"), (
            run["first_error"], run["verdict"])
        assert [i["id"] for i in bot.store.items(run_id)] == [f"doc-0{n}" for n in range(1, 5)]
        local_run = Path(run["run_dir"])
        remote_run = workdir / "runs" / run_id
        assert (local_run / "events.jsonl").read_bytes() == \
            (remote_run / "events.jsonl").read_bytes()
        assert (local_run / "exit_code").read_text().strip() == "0"  # fetched back
    finally:
        bot.close()
