"""Connections to a real sshd killed at several moments of a pilot: never a wrong verdict.

Each test kills the sshd processes serving the bot (``Sshd.kill_connections``) at one
moment, through a fault hook in a dispatcher subclass that the test arms (no sleeps):
during the upload, during a status probe (its connection gone under it),
during the pilot while a ``preflight follow`` process follows it, and during the evidence
fetch. In every case the run ends with its true outcome, every id once, every event seq
once, and the follower's exit code says what happened. A node that stays unreachable makes
the follower give up with its own exit code (3), leaving the run running.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

from bot.dispatch.upload import RUNNER_PACKAGE, SSHNode
from bot.node_programs.fetch_stream import HELD
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.service.handles import handle_for
from tests.remote.remote_kit import (
    REPO,
    assert_exactly_once,
    items_done,
    make_bot,
    pilote_bot,
    provisioned_bot,
    pump_until,
    start_run,
    submit,
    wait_for,
    write_project,
)
from tests.remote.sshd_server import Sshd, _children, running_sshd

T = TypeVar("T")


class FaultySSH(SSHDispatcher):
    """Kills the serving sshd processes once, at the moment the test armed."""

    sshd: Sshd
    armed: str | None = None
    fired: list[str]

    def _fire(self, moment: str) -> None:
        if self.armed == moment:
            self.armed = None
            self.fired.append(moment)
            assert self.sshd.kill_connections() >= 1

    async def _stream(self, node: SSHNode, launcher: Any, send: list[tuple[Path, str]],
                      data: dict[str, bytes], workdir: str = "",
                      report: Callable[[int, int], None] | None = None) -> None:
        self._fire("upload")
        return await super()._stream(node, launcher, send, data, workdir, report)

    async def _probe_files(self, node: SSHNode, pid: Any, run_dir: str) -> str | None:
        # The sshd serving the probe dies under it: its SFTP requests get no answer.
        self._fire("probe")
        return await super()._probe_files(node, pid, run_dir)

    async def guarded(self, node: SSHNode,
                      work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        return await super().guarded(node, lambda conn: work(_KillInEvidence(self, conn)))


class _KillInEvidence:
    """The dispatcher's connection; the armed "evidence" fault fires once the fetch's
    stream of the evidence copy has begun."""

    def __init__(self, owner: FaultySSH, conn: Any) -> None:
        self.owner, self.conn = owner, conn

    async def create_process(self, command: str, **kw: Any) -> Any:
        proc = await self.conn.create_process(command, **kw)
        if HELD in command and "/evidence/" in command:
            return _FireOnData(proc, self.owner)
        return proc

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class _FireOnData:
    """A fetch process whose first bytes fire the armed fault, once they have arrived."""

    def __init__(self, proc: Any, owner: FaultySSH) -> None:
        self.proc, self.owner, self.stdout = proc, owner, self

    async def read(self, n: int) -> bytes:
        data = await self.proc.stdout.read(n)
        self.owner._fire("evidence")
        return bytes(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.proc, name)


def faulty(sshd: Sshd, **kw: Any) -> FaultySSH:
    dispatcher = sshd.dispatcher(FaultySSH, **kw)
    assert isinstance(dispatcher, FaultySSH)
    dispatcher.sshd, dispatcher.fired = sshd, []
    return dispatcher


def test_drop_during_upload_dispatch_is_redone_and_the_pilot_passes(tmp_path: Path,
                                                                    sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir), count=4)
    with provisioned_bot(tmp_path / "home", sshd, faulty(sshd)) as bot:
        run_id = submit(bot, manifest)
        bot.dispatcher.armed = "upload"  # type: ignore[attr-defined]
        bot.service.starter.start(run_id)
        assert bot.dispatcher.fired == ["upload"]  # type: ignore[attr-defined]
        assert bot.dispatcher.connects >= 2
        run = bot.service.follower.follow(run_id, timeout=60)
        assert run["outcome"] == "passed", run["verdict"]
        assert_exactly_once(bot, run_id, workdir / "runs" / run_id)
        assert sorted(i["id"] for i in bot.store.items(run_id)) == [
            f"doc-{n:02d}" for n in range(1, 5)]
        assert not (workdir / "dispatch.lock").exists()  # the runner ended, the lock went


def test_probe_cut_off_is_no_contact_not_a_failure(tmp_path: Path, sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir), count=4, gate_after=2)
    with provisioned_bot(tmp_path / "home", sshd, faulty(sshd)) as bot:
        run_id = start_run(bot, manifest)
        pump_until(bot, run_id, items_done(2))
        bot.dispatcher.armed = "probe"  # type: ignore[attr-defined]
        handle = handle_for(bot.store.run_record(run_id))
        assert bot.dispatcher.is_alive(handle)  # unknown is not dead
        assert bot.dispatcher.fired == ["probe"]  # type: ignore[attr-defined]
        (workdir / "runs" / run_id / "go").write_text("")
        run = bot.service.follower.follow(run_id, timeout=60)
        assert run["outcome"] == "passed", run["verdict"]
        assert_exactly_once(bot, run_id, workdir / "runs" / run_id)


def _cli_env(sshd: Sshd, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    env.update({"PREFLIGHT_HOME": str(home), "PREFLIGHT_SSH_KNOWN_HOSTS": str(sshd.known_hosts),
                "PREFLIGHT_SSH_KEYS": str(sshd.user_key), "SSH_AUTH_SOCK": "",
                "COLUMNS": "200", **extra})
    return env


def test_follower_process_survives_a_drop_during_the_pilot_and_exits_0(tmp_path: Path,
                                                                       sshd: Sshd) -> None:
    workdir, home = tmp_path / "node", tmp_path / "home"
    manifest = write_project(tmp_path / "project", sshd.node(workdir), count=5, gate_after=2)
    with provisioned_bot(home, sshd) as bot:
        run_id = start_run(bot, manifest)
        pump_until(bot, run_id, items_done(2))
        bot.dispatcher.close()  # the follower process below is now the only client
        wait_for(lambda: not _children(sshd.proc.pid), what="the bot's connection to close")
        follower = subprocess.Popen([sys.executable, "-m", "bot", "follow", run_id], cwd=REPO,
                                    env=_cli_env(sshd, home), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: _children(sshd.proc.pid), what="the follower to connect")
            assert sshd.kill_connections() >= 1
            (workdir / "runs" / run_id / "go").write_text("")
            out, err = follower.communicate(timeout=90)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.communicate()
        assert follower.returncode == 0, (out, err)
        run = bot.store.get_run(run_id)
        assert (run["status"], run["outcome"]) == ("awaiting_decision", "passed")
        assert_exactly_once(bot, run_id, workdir / "runs" / run_id)
        assert len(bot.store.items(run_id)) == 5


def test_follower_gives_up_on_a_node_gone_with_exit_3_and_the_run_left_running(
        tmp_path: Path) -> None:
    workdir, home = tmp_path / "node", tmp_path / "home"
    with ExitStack() as stack:
        own = stack.enter_context(running_sshd(tmp_path / "sshd"))
        manifest = write_project(tmp_path / "project", own.node(workdir), count=4, gate_after=2)
        bot = stack.enter_context(provisioned_bot(home, own))
        run_id = start_run(bot, manifest)
        pump_until(bot, run_id, items_done(2))
        env = _cli_env(own, home, PREFLIGHT_SSH_GIVE_UP_S="1")
        stack.close()  # the bot closes, the node's sshd goes away; the runner keeps waiting
    try:
        done = subprocess.run([sys.executable, "-m", "bot", "follow", run_id], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=90)
    finally:
        (workdir / "runs" / run_id / "go").write_text("")  # let the runner end
    message = " ".join(done.stderr.split())
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert f"lost contact with the node of run {run_id}" in message
    assert "may still be running" in message and f"preflight follow {run_id}" in message
    again = make_bot(home, SSHDispatcher())
    try:
        run = again.store.get_run(run_id)
        assert (run["status"], run["outcome"]) == ("running", None)  # nothing was judged
        wait_for(lambda: (workdir / "runs" / run_id / "exit_code").exists(),
                 what="the runner to end")
    finally:
        again.close()


def test_drop_during_evidence_fetch_retries_and_verifies_only_the_whole_copy(
        tmp_path: Path, sshd: Sshd) -> None:
    workdir, evidence = tmp_path / "node", tmp_path / "evidence"
    faults = faulty(sshd, runner_package=RUNNER_PACKAGE)
    with pilote_bot(tmp_path, sshd, dispatcher=faults) as (bot, pilote):
        run_id = submit(bot, pilote, submitter="alice")
        bot.dispatcher.armed = "evidence"  # type: ignore[attr-defined]
        bot.service.starter.start(run_id)
        run = bot.service.follower.follow(run_id, timeout=120)
        assert bot.dispatcher.fired == ["evidence"]  # type: ignore[attr-defined]
        assert run["outcome"] == "passed", (run["first_error"], run["verdict"])
        assert run["evidence"]["verified"] and "fetch_error" not in run["evidence"]
        assert sorted(p.name for p in evidence.iterdir()) == [run_id]  # no partial left
        assert_exactly_once(bot, run_id, workdir / "runs" / run_id)
        assert not (Path(run["run_dir"]) / ".fetch").exists()
