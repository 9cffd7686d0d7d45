"""One runner per node workdir, and a layout a restarted bot can always find (real sshd)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.upload import SSHNode, locate
from bot.errors import DispatchError
from bot.node_programs import LAUNCH_SCRIPT
from bot.nodes.ssh.dispatcher import SSHDispatcher
from runner.events import Event
from tests.remote.remote_kit import (
    Bot,
    items_done,
    make_bot,
    provision,
    provisioned_bot,
    pump_until,
    start_run,
    submit,
    wait_for,
    write_project,
)
from tests.remote.sshd_server import BARE_PYTHON, Sshd


def _layout(bot: Bot, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (Path(bot.store.get_run(run_id)["run_dir"]) / "remote.json").read_text())
    return data


def _passes(bot: Bot, manifest: Path, workdir: Path | None = None) -> str:
    """A run dispatched and followed to a pass (its gate, if any, opened in ``workdir``)."""
    run_id = submit(bot, manifest)
    if workdir is not None:
        (workdir / "runs" / run_id).mkdir(parents=True)
        (workdir / "runs" / run_id / "go").write_text("")
    bot.service.starter.start(run_id)
    assert bot.service.follower.follow(run_id, timeout=60)["outcome"] == "passed"
    return run_id


def test_a_second_bot_is_refused_while_a_runner_works_in_the_same_workdir(tmp_path: Path,
                                                                          sshd: Sshd) -> None:
    workdir, project = tmp_path / "node", tmp_path / "project"
    manifest = write_project(project, sshd.node(workdir), count=4, gate_after=2)
    with (provisioned_bot(tmp_path / "home-a", sshd) as first,
          provisioned_bot(tmp_path / "home-b", sshd) as second):  # another bot process
        busy = start_run(first, manifest)
        pump_until(first, busy, items_done(2))  # the runner is working on the node's copy
        lock = json.loads((workdir / "dispatch.lock").read_text())
        assert (lock["run"], lock["pid"]) == (busy, _layout(first, busy)["pid"])
        remote_app = next((workdir / "projects").iterdir()) / "src" / "app.py"
        (project / "src" / "app.py").write_text("VALUE = 2\n")  # would be sent under the runner
        refused = submit(second, manifest)
        with pytest.raises(DispatchError) as info:
            second.service.starter.start(refused)
        where = SSHNode.from_dict(sshd.node(workdir)).where
        for part in (where, f"workdir {workdir} ", f"in use by run {busy} (pid {lock['pid']}"):
            assert part in str(info.value)
        assert second.store.get_run(refused)["status"] == "dispatch_failed"
        assert remote_app.read_text() == "VALUE = 1\n"  # nothing uploaded, nothing removed
        assert not (workdir / "runs" / refused).exists()
        (workdir / "runs" / busy / "go").write_text("")
        assert first.service.follower.follow(busy, timeout=60)["outcome"] == "passed"
        assert not (workdir / "dispatch.lock").exists()  # the runner's end drops it
        again = _passes(second, manifest, workdir)
        assert second.dispatcher.uploaded[again]["project"] == len("VALUE = 2\n")
        assert remote_app.read_text() == "VALUE = 2\n"


def test_a_stale_lock_is_taken_over(tmp_path: Path, sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    workdir.mkdir()
    lock = workdir / "dispatch.lock"
    manifest = write_project(tmp_path / "project", sshd.node(workdir))
    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        stale = [{"run": "dead-run", "pid": ended.pid, "start": None},  # its process ended
                 {"run": "reused-pid", "pid": os.getpid(), "start": "1"}]  # pid now another's
        for holder in stale:
            lock.write_text(json.dumps(holder))
            _passes(bot, manifest)
            assert not lock.exists()
        lock.write_text('{"run": "torn')  # a half-written file holds nothing
        _passes(bot, manifest)


def test_the_lock_is_held_before_the_launch_and_dropped_when_the_bot_goes(tmp_path: Path,
                                                                           sshd: Sshd) -> None:
    """A dispatch still uploading holds the workdir too; its connection gone, it is free."""
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir))
    lock = workdir / "dispatch.lock"
    uploading = subprocess.Popen(
        [BARE_PYTHON, "-c", LAUNCH_SCRIPT, str(lock), "other-run", str(workdir / "runs" / "x"),
         str(workdir), str(workdir), "true"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    bot = make_bot(tmp_path / "home", sshd.dispatcher())
    try:
        assert uploading.stdout is not None and uploading.stdin is not None
        assert json.loads(uploading.stdout.readline()) == {"locked": "other-run"}
        provision(bot.store, sshd.lease_key)
        with pytest.raises(DispatchError, match=f"in use by run other-run \\(pid {uploading.pid}"):
            bot.service.starter.start(submit(bot, manifest))
        uploading.stdin.close()  # what a dead bot's dropped connection does
        assert uploading.wait(30) == 0 and not lock.exists()
        _passes(bot, manifest)
    finally:
        if uploading.poll() is None:
            uploading.kill()
        uploading.wait(10)
        for pipe in (uploading.stdin, uploading.stdout):
            if pipe is not None:
                pipe.close()
        bot.close()


class _Crash(Exception):
    """The bot process dies here (not a PreflightError: nothing records a failed dispatch)."""


class _DiesAtLaunch(SSHDispatcher):
    """Dies right after the node launched the runner (``after``) or just before it."""

    after = True

    async def _launch(self, node: SSHNode, launcher: Any, env: dict[str, str]) -> int:
        if self.after:
            await super()._launch(node, launcher, env)
        raise _Crash("the bot died during the launch")


class _DiesBeforeLaunch(_DiesAtLaunch):
    after = False


def _crash_then_restart(tmp_path: Path, sshd: Sshd, manifest: Path,
                        cls: type[SSHDispatcher]) -> tuple[Bot, str, RunHandle]:
    with provisioned_bot(tmp_path / "home", sshd, sshd.dispatcher(cls=cls)) as crashed:
        run_id = submit(crashed, manifest)
        with pytest.raises(_Crash):
            crashed.service.starter.start(run_id)
    bot = make_bot(tmp_path / "home", sshd.dispatcher())  # the restarted bot
    run = bot.store.get_run(run_id)
    assert (run["status"], run["pid"]) == ("dispatching", None)
    return bot, run_id, RunHandle(run_id, Path(run["run_dir"]), Path(run["spec_path"]),
                                  Path(run["run_dir"]), node=None)


def test_a_bot_dying_after_the_launch_leaves_a_run_it_finds_again(tmp_path: Path,
                                                                  sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir), count=4, gate_after=2)
    bot, run_id, handle = _crash_then_restart(tmp_path, sshd, manifest, _DiesAtLaunch)
    try:
        node, layout = locate(handle)  # remote.json was written before the launch, without pid
        assert layout["pid"] is None and layout["run_dir"] == str(workdir / "runs" / run_id)
        assert node.port == sshd.port
        # the node's runner.pid stands in for the missing pid: alive, and followed
        assert bot.dispatcher.is_alive(handle) and bot.dispatcher.exit_code(handle) is None
        def items(events: list[Event]) -> int:
            return sum(e.type == "item.done" for e in events)

        wait_for(lambda: items(bot.dispatcher.read_events(handle, 0)[0]) >= 2,
                 what="the lost runner's events")
        # the lock is the runner's: nothing else is dispatched into its workdir meanwhile
        with pytest.raises(DispatchError, match=f"in use by run {run_id} "):
            bot.service.starter.start(submit(bot, manifest))
        bot.dispatcher.stop(handle)  # by the node's runner.pid too
        wait_for(lambda: not bot.dispatcher.is_alive(handle), what="the runner to stop")
        _passes(bot, manifest, workdir)  # its lock is stale now: taken over
    finally:
        bot.close()


def test_a_bot_dying_before_the_launch_leaves_a_starting_run_and_a_free_workdir(
        tmp_path: Path, sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir))
    bot, run_id, handle = _crash_then_restart(tmp_path, sshd, manifest, _DiesBeforeLaunch)
    try:
        assert locate(handle)[1]["pid"] is None
        assert not (workdir / "runs" / run_id / "runner.pid").exists()
        # no pid anywhere and no exit status: unknown, "still starting", never "dead"
        assert bot.dispatcher.is_alive(handle) and bot.dispatcher.exit_code(handle) is None
        assert bot.dispatcher.read_events(handle, 0) == ([], 0)
        bot.dispatcher.stop(handle)  # nothing to stop: no error either
        assert not (workdir / "dispatch.lock").exists()
        _passes(bot, manifest)
    finally:
        bot.close()
