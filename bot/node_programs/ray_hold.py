"""Runs on a node: a volume's Ray in a process group of its own, its stop, and the hold of
a workdir lock while it lives. Sent as its text (``NODE_RAY`` in ``ray_cluster.py``, run by
``python -c``), so it imports only the standard library; ruff and mypy read it here.

``python -c NODE_RAY start DIR ARGV...``: makes the run's Ray temp dir ``DIR`` private
(0700), then runs ``python ARGV...`` (``-m ray.scripts.scripts start ...``) in a process
group of its own, whose id it writes to ``DIR/preflight.pgid``; every Ray process it starts
stays in that group (the actors take their own, and die with their raylet), so a stop ends
exactly this run's Ray, not another Ray of the same user.

``python -c NODE_RAY stop DIR``: SIGTERM to that group, then SIGKILL, each given up to 2 s;
a member that ended but is not reaped yet (a node whose init reaps late, as in many
containers) counts as ended. Once the group has ended, ``DIR`` (Ray's sockets and logs of
this run) is removed. Two stops of the same Ray at once (two bot processes ending one run)
both succeed: the second finds the group gone, or the file already removed.

``python -c NODE_RAY hold`` (launched by the node's launcher on a volume node other than the
head, ``PREFLIGHT_HOLD_RAY`` naming ``DIR``): lives as long as the group does (the file is
removed when it is stopped), and with it the launcher's supervisor, which holds the node's
workdir lock, so no other dispatch writes under its workers.

The temp dir has a predictable name under a shared /tmp, so another user of the node could
create it first and choose which process group a stop kills. One that already exists and
is not a real folder owned by the node user with no access for others is refused, naming
the path, before Ray starts; a stop or a hold trusts ``preflight.pgid`` only inside a
folder that passes the same check (``not_private``).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import time
from typing import List, Optional

PGID_FILE = "preflight.pgid"
HOLD_ENV = "PREFLIGHT_HOLD_RAY"
ENDED_STATES = ("Z", "X")  # a zombie, or dead: ended, reaped or not (launcher.py too)
REFUSED = 3  # the exit status of a temp dir that is not private


def not_private(d: str) -> Optional[str]:
    """Why ``d`` is not a private folder of this user (None: it is, or it does not exist)."""
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return None
    kind = "a link" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) \
        else "not a folder"
    if kind == "a folder" and st.st_uid == os.getuid() and not st.st_mode & 0o077:
        return None
    return (f"preflight: the Ray temp dir {d} is {kind} of uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):o}, not a private folder of this user (uid "
            f"{os.getuid()}): another user may control it. Remove it (or ask its owner to) "
            "and start again")


def start(d: str, argv: List[str]) -> int:
    """Make ``d`` private, then run ``python argv...`` in a new session whose group id is
    written to ``d/preflight.pgid``; returns its exit status."""
    os.makedirs(os.path.dirname(d) or ".", exist_ok=True)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    problem = not_private(d)
    if problem:
        sys.stderr.write(problem + "\n")
        return REFUSED
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os.setsid()
    fd = os.open(os.path.join(d, PGID_FILE),
                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.write(fd, str(os.getpgid(0)).encode())
    os.close(fd)
    os.execv(sys.executable, [sys.executable] + argv)
    return 0  # not reached: execv replaced this process


def _group(d: str) -> Optional[int]:
    """The group named in ``d/preflight.pgid`` when it is a regular file of this user
    (None: none, or nobody's word)."""
    try:
        fd = os.open(os.path.join(d, PGID_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                return None
            group = int(os.read(fd, 64))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    return group if group > 1 else None


def _signal(group: int, sig: int) -> bool:
    """Send ``sig`` to the group; True when it is gone."""
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        return True
    return False


def _ended(group: int) -> bool:
    """No member of ``group`` is left but zombies and the dead."""
    if _signal(group, 0):
        return True
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return False
    for n in names:
        try:
            with open("/proc/" + n + "/stat") as fh:
                fields = fh.read().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] not in ENDED_STATES:
            return False
    return True


def stop(d: str) -> int:
    """End the group ``d/preflight.pgid`` names (SIGTERM, then SIGKILL); 3 when ``d`` is not
    private (nothing stopped), else 0."""
    problem = not_private(d)
    if problem:
        sys.stderr.write(problem + "; its preflight.pgid was not trusted, nothing stopped\n")
        return REFUSED
    group = _group(d)
    if group is not None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if _signal(group, sig):
                break
            if _wait_ended(group):
                break
    try:
        os.remove(os.path.join(d, PGID_FILE))
    except FileNotFoundError:  # another stop of the same Ray (a second bot process) did
        pass
    if group is None or _ended(group):  # nothing of it left to write there: the folder goes
        shutil.rmtree(d, ignore_errors=True)
    return 0


def _wait_ended(group: int, tries: int = 40, pause: float = 0.05) -> bool:
    """Up to ``tries`` × ``pause`` seconds for the group to end; True when it did."""
    for _ in range(tries):
        time.sleep(pause)
        if _ended(group):
            return True
    return False


def hold(d: str) -> int:
    """Live while the group ``d/preflight.pgid`` names does (and the file is there)."""
    if not d or not_private(d) or not os.path.isdir(d):
        return 0  # a group named in a temp dir that is not ours alone is nobody's word
    group = _group(d)
    path = os.path.join(d, PGID_FILE)
    while group is not None and os.path.exists(path):
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(1)
    return 0


def main(argv: List[str]) -> int:
    mode = argv[1] if len(argv) > 1 else ""
    if mode == "start" and len(argv) > 3:
        return start(argv[2], argv[3:])
    if mode == "stop" and len(argv) == 3:
        return stop(argv[2])
    if mode == "hold":
        return hold(os.environ.get(HOLD_ENV, ""))
    sys.stderr.write(f"usage: start DIR ARGV... | stop DIR | hold ({HOLD_ENV}=DIR)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
