"""The run's Ray temp dir on a node is private, and a stop trusts only a private one
(issue 24, item 7). The start and stop scripts run here as the real subprocesses a node
runs, with a stand-in for ``ray start`` (no Ray needed)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.dispatch.ray_cluster import RAY_SUBDIR, RayNode, start_command, stop_command
from bot.node_programs import NODE_RAY
from bot.node_programs.ray_hold import HOLD_ENV

# Stands in for ``-m ray.scripts.scripts start ...``: leaves a mark, then lives on in the
# process group ray_hold.py's start made (as Ray's daemons do) while the command returns.
FAKE_RAY = ("import os, subprocess, sys\nopen(sys.argv[1], 'w').write('ran')\n"
            "os.makedirs(sys.argv[2], exist_ok=True)\nos.chmod(sys.argv[2], 0o777)\n"  # as Ray does
            "d = subprocess.DEVNULL\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "stdin=d, stdout=d, stderr=d)")


def start(temp_dir: Path, mark: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", NODE_RAY, "start", str(temp_dir), "-c", FAKE_RAY,
                           str(mark), str(temp_dir / RAY_SUBDIR)], capture_output=True,
                          text=True, timeout=60)


def stop(temp_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", NODE_RAY, "stop", str(temp_dir)],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a group of its own: what a hostile preflight.pgid would name."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)
    yield proc
    proc.kill()
    proc.wait(timeout=30)


def alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until_gone(group: int, within: float = 30) -> bool:
    deadline = time.monotonic() + within
    while True:
        if not alive(group):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def test_a_fresh_temp_dir_is_made_private_and_stop_ends_its_group(tmp_path: Path) -> None:
    temp_dir = tmp_path / "pf-ray-0123abcd-0"
    done = start(temp_dir, tmp_path / "mark")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mark").read_text() == "ran"
    assert stat.S_IMODE(temp_dir.stat().st_mode) == 0o700
    assert temp_dir.stat().st_uid == os.getuid()
    group = int((temp_dir / "preflight.pgid").read_text())
    try:
        assert alive(group)
        done = stop(temp_dir)
    finally:
        if not wait_until_gone(group, within=0):
            os.killpg(group, 9)
    assert done.returncode == 0, done.stderr
    assert wait_until_gone(group)
    assert not (temp_dir / "preflight.pgid").exists()


def plant(temp_dir: Path, group: int, mode: int) -> None:
    """Another user got there first: the dir and a preflight.pgid of their choosing."""
    temp_dir.mkdir()
    (temp_dir / "preflight.pgid").write_text(str(group))
    temp_dir.chmod(mode)


@pytest.mark.parametrize("mode", [0o755, 0o777, 0o1777, 0o750, 0o701])
def test_an_existing_temp_dir_with_a_looser_mode_is_refused(
        tmp_path: Path, victim: subprocess.Popen[bytes], mode: int) -> None:
    temp_dir = tmp_path / "pf-ray-0123abcd-0"
    plant(temp_dir, victim.pid, mode)
    done = start(temp_dir, tmp_path / "mark")
    assert done.returncode == 3
    assert str(temp_dir) in done.stderr and "not a private folder" in done.stderr
    assert f"mode {mode:o}" in done.stderr
    assert not (tmp_path / "mark").exists()  # Ray never started there
    assert (temp_dir / "preflight.pgid").read_text() == str(victim.pid)  # not rewritten
    done = stop(temp_dir)  # nor does a stop trust the group it names
    assert done.returncode == 3 and "not trusted" in done.stderr
    assert str(temp_dir) in done.stderr
    assert victim.poll() is None and alive(victim.pid)


def test_an_existing_temp_dir_of_another_owner_is_refused(
        tmp_path: Path, victim: subprocess.Popen[bytes]) -> None:
    temp_dir = tmp_path / "pf-ray-0123abcd-0"
    plant(temp_dir, victim.pid, 0o700)
    if os.getuid() == 0:
        os.chown(temp_dir, 65534, 65534)  # nobody
    else:  # without root: a folder someone else owns (root's /)
        temp_dir = Path("/")
    owner = temp_dir.stat().st_uid
    assert owner != os.getuid()
    done = start(temp_dir, tmp_path / "mark")
    assert done.returncode == 3 and f"uid {owner}" in done.stderr
    assert str(temp_dir) in done.stderr
    assert not (tmp_path / "mark").exists()
    done = stop(temp_dir)
    assert done.returncode == 3 and alive(victim.pid)


def test_a_temp_dir_that_is_a_link_is_refused(tmp_path: Path,
                                               victim: subprocess.Popen[bytes]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "preflight.pgid").write_text(str(victim.pid))
    temp_dir = tmp_path / "pf-ray-0123abcd-0"
    temp_dir.symlink_to(elsewhere)
    done = start(temp_dir, tmp_path / "mark")
    assert done.returncode == 3 and "is a link" in done.stderr
    assert stop(temp_dir).returncode == 3 and alive(victim.pid)


def test_the_workdir_hold_ignores_a_group_in_a_loose_temp_dir(
        tmp_path: Path, victim: subprocess.Popen[bytes]) -> None:
    temp_dir = tmp_path / "pf-ray-0123abcd-1"
    plant(temp_dir, victim.pid, 0o755)
    done = subprocess.run([sys.executable, "-c", NODE_RAY, "hold"], capture_output=True,
                          env={**os.environ, HOLD_ENV: str(temp_dir)}, timeout=60)
    assert done.returncode == 0  # ends at once instead of holding while that group lives


def test_ray_gets_a_folder_inside_the_private_temp_dir() -> None:
    node = RayNode("u@h:22", "h", temp_dir="/tmp/pf-ray-0123abcd-0")
    assert "--temp-dir /tmp/pf-ray-0123abcd-0/ray " in start_command(node, None)
    assert stop_command(node).endswith("/tmp/pf-ray-0123abcd-0")


def test_the_workdir_hold_lives_as_long_as_the_ray_group(tmp_path: Path) -> None:
    """ray_hold.py's hold on a volume node: alive while the Ray group it names lives, ended
    once that group is stopped (its preflight.pgid removed)."""
    temp_dir = tmp_path / "pf-ray-0123abcd-2"
    assert start(temp_dir, tmp_path / "mark").returncode == 0
    group = int((temp_dir / "preflight.pgid").read_text())
    holder = subprocess.Popen([sys.executable, "-c", NODE_RAY, "hold"],
                              env={**os.environ, HOLD_ENV: str(temp_dir)})
    try:
        time.sleep(1.5)
        assert holder.poll() is None  # the group lives: the hold (and the lock) too
        assert stop(temp_dir).returncode == 0
        assert holder.wait(timeout=10) == 0
    finally:
        holder.kill()
        holder.wait()
        if not wait_until_gone(group, within=0):
            os.killpg(group, 9)
    assert wait_until_gone(group)


def test_node_ray_says_how_to_call_it() -> None:
    done = subprocess.run([sys.executable, "-c", NODE_RAY, "restart", "/tmp/x"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage: start DIR ARGV... | stop DIR | hold" in done.stderr


# Stands in for a Ray whose other stop (a second bot process ending the same run) removes
# the group's file while this stop waits for the group to end.
RACED_RAY = ("import os, signal, subprocess, sys\nd = subprocess.DEVNULL\n"
             "subprocess.Popen([sys.executable, '-c', 'import os, signal, sys, time\\n"
             "def gone(*_):\\n    os.remove(sys.argv[1])\\n    os._exit(0)\\n"
             "signal.signal(signal.SIGTERM, gone)\\ntime.sleep(120)', sys.argv[1]], "
             "stdin=d, stdout=d, stderr=d)")


def test_a_stop_whose_file_another_stop_removed_succeeds_and_the_dir_goes(
        tmp_path: Path) -> None:
    """Two bot processes stop one volume's Ray at once: the second finds the group's file
    already removed, which is no failure (it was FileNotFoundError: preflight.pgid, and the
    fetch of the run's results was refused); the run's Ray temp dir goes with its Ray."""
    temp_dir = tmp_path / "pf-ray-0123abcd-1"
    done = subprocess.run([sys.executable, "-c", NODE_RAY, "start", str(temp_dir), "-c",
                           RACED_RAY, str(temp_dir / "preflight.pgid")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    group = int((temp_dir / "preflight.pgid").read_text())
    try:
        done = stop(temp_dir)
    finally:
        if not wait_until_gone(group, within=5):
            os.killpg(group, 9)
    assert done.returncode == 0, done.stderr
    assert not temp_dir.exists()  # its sockets and logs removed with the cluster
    assert stop(temp_dir).returncode == 0  # a stop of a Ray already gone: nothing to do
