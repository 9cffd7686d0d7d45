"""Runs on the node: the launcher (``LAUNCH_SCRIPT`` in ``bot/node_programs/__init__.py``).

It runs with the node's own interpreter (Python >= 3.9, standard library only) before the
runner package is there, passed to ``python -c`` as this file's text with
``untar.py``'s in front of it; so it imports nothing of ours at run time (``Chunks``
and ``untar`` are that text's), and its few temp-file-and-rename writes are its own. The
bot imports it too, for the one rule of "a process is running" (``running``), which the
local dispatcher and the SSH probe share with the launcher's lock.

It takes the workdir's lock, then answers the bot's lines on stdin, all under the lock and
in this one SSH session (each session costs the node's login shell start-up, and an SFTP
channel is one more session):

- ``hash [skip, top, roots, dirs, excluded]`` (JSON): makes the directories the upload
  writes into and prints the hashes of the files under the roots, folders in ``excluded``
  left out (``print_hashes``: lines of at most 2,000 files, then ``{"end": <files>}``);
  a file unchanged since the last answer (size, times, inode) is not read again
  (``hashcache.py``, the workdir's ``hash-cache.json``);
- ``put [path, size]`` then that many bytes: writes the file (a temporary file renamed);
- ``tar`` then one tar archive in chunks (``<n>`` line, n bytes; ``0`` ends it): unpacks it
  under the workdir (untar.py: links, absolute and ``..`` members refused);
- ``sync``: prints the files it could not write since the last sync (``{"failed": [...]}``);
- ``launch``: starts the runner detached (its own session, output to runner.log, exit
  status to exit_code); a JSON object after ``launch`` on the same line is added to the
  runner's environment.

The lock (``dispatch.lock``: run, pid, process start time) names a live process for as
long as the workdir is in use: this process while the bot uploads, then the runner's
supervisor; it is dropped when the runner ends or when the bot goes away before the launch
(stdin closed). A lock whose pid is dead, a zombie or another process is stale.

The hashes use the same skip rules as the bot's side: what is never sent (a virtual
environment built on the node, caches, runs/) is neither hashed (a torch venv is gigabytes)
nor removed as stale.
"""

import fcntl
import json
import os
import stat
import subprocess
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:  # on the node these are the texts put in front of this one
    from bot.node_programs.hashcache import HashCache
    from bot.node_programs.untar import Chunks, untar

HASH_CACHE = "hash-cache.json"  # in the workdir: the digests of the last hash answer


def stat_fields(text: Union[str, bytes]) -> List[str]:
    """The fields of a ``/proc/<pid>/stat`` line after the command name (state first)."""
    raw = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    parts = raw.rsplit(")", 1)
    return parts[1].split() if len(parts) == 2 else []


ENDED_STATES = ("Z", "X")  # a zombie, or dead: ended, whether or not reaped yet


def running(pid: int) -> Optional[List[str]]:
    """The fields of ``/proc/<pid>/stat`` while ``pid`` is running (empty where there is no
    /proc to read), or None when it is gone, a zombie or dead (``ENDED_STATES``, as the
    runner's own Ray group stop and the node's Ray stop read them)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # another user's process: it exists
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = stat_fields(fh.read())
    except OSError:
        return []
    return None if fields[:1] and fields[0] in ENDED_STATES else fields


HASH_LINE_FILES = 2000  # files per line of the hash answer (a line stays well under 1 MiB)


def hashes(skip: List[str], top: List[str], roots: List[str],
           excluded: Optional[List[str]], cache: "HashCache") -> Dict[str, Dict[str, str]]:
    """root -> relative path -> sha256 of every file under ``roots``, skipping the folders
    in ``skip`` (anywhere), in ``top`` (at a root), those in ``excluded`` (absolute paths:
    never sent, so never hashed nor removed) and virtual environments. ``cache``
    reads each digest, remembered across dispatches (``hashcache.py``; ``HashCache(None)``
    remembers nothing)."""
    out: Dict[str, Dict[str, str]] = {}
    left_out = set(excluded or [])
    for root in roots:
        os.makedirs(root, exist_ok=True)
        files = {}
        for base, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in skip
                       and not (base == root and d in top)
                       and os.path.join(base, d) not in left_out
                       and not os.path.exists(os.path.join(base, d, "pyvenv.cfg"))]
            for name in names:
                path = os.path.join(base, name)
                if name.endswith(".pyc"):
                    continue
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                files[os.path.relpath(path, root).replace(os.sep, "/")] = \
                    cache.sha256(path, st)
        out[root] = files
    return out


def print_hashes(found: Dict[str, Dict[str, str]], out: IO[str]) -> None:
    """The hash answer in bounded lines: ``{"root", "files"}`` of at most
    ``HASH_LINE_FILES`` files each (one at least per root), then ``{"end": <files>}``; a
    project of 100,000 files is some fifty lines, never one of megabytes."""
    total = 0
    for root, files in found.items():
        names = sorted(files)
        for start in range(0, max(1, len(names)), HASH_LINE_FILES):
            part = {n: files[n] for n in names[start:start + HASH_LINE_FILES]}
            out.write(json.dumps({"root": root, "files": part}) + "\n")
        total += len(names)
    out.write(json.dumps({"end": total}) + "\n")
    out.flush()


class Lock:
    """The workdir's ``dispatch.lock``, read and changed under ``<lock>.guard``'s flock."""

    def __init__(self, path: str, run: str, run_dir: str) -> None:
        self.path, self.run, self.run_dir = path, run, run_dir

    def locked(self, change: Callable[[Optional[Dict[str, Any]]], Any]) -> Any:
        fd = os.open(self.path + ".guard", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                with open(self.path) as fh:
                    held = json.load(fh)
            except (OSError, ValueError):
                held = None
            return change(held if isinstance(held, dict) else None)
        finally:
            os.close(fd)

    def write(self, pid: int) -> None:
        fields, tmp = running(pid) or [], f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump({"run": self.run, "pid": pid,
                       "start": fields[19] if len(fields) > 19 else None,
                       "run_dir": self.run_dir,
                       "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, fh)
        os.replace(tmp, self.path)

    def take(self, held: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        """None once this process holds the lock; else the live holder's record."""
        if held is not None and alive(held):
            return held
        self.write(os.getpid())
        return None

    def release(self, held: Optional[Dict[str, Any]]) -> None:
        if ours(held):
            os.remove(self.path)


def alive(held: Dict[str, Any]) -> bool:
    """Whether the lock's process is still the one that took it (running, same start)."""
    pid = held.get("pid")
    if not isinstance(pid, int) or pid <= 1:
        return False
    fields = running(pid)
    return fields is not None and (not fields or held.get("start") in (None, fields[19]))


def ours(held: Optional[Dict[str, Any]]) -> bool:
    return held is not None and held.get("pid") == os.getpid()


def command() -> Tuple[str, str]:
    word, _, extra = sys.stdin.buffer.readline().decode("utf-8").strip().partition(" ")
    return word, extra


def put(path: str, size: int, failed: List[str]) -> None:
    """Writes the next ``size`` bytes of stdin to ``path``; a file that cannot be written
    is named in ``failed``. The bytes are read in full even then: the next line follows."""
    tmp = f"{path}.{os.getpid()}.part"
    fh: Optional[IO[bytes]] = None
    error: Optional[OSError] = None
    try:
        fh = open(tmp, "wb")
    except OSError as exc:
        error = exc
    while size:
        chunk = sys.stdin.buffer.read(min(size, 1 << 20))
        if not chunk:  # stdin closed in the middle of a file: the bot is gone
            if fh is not None:
                fh.close()
                os.remove(tmp)
            raise EOFError(path)
        size -= len(chunk)
        if fh is not None and error is None:
            try:
                fh.write(chunk)
            except OSError as exc:
                error = exc
    if fh is not None:
        try:
            fh.close()
        except OSError as exc:
            error = error or exc
    if error is None:
        try:
            os.replace(tmp, path)
        except OSError as exc:
            error = exc
    if error is not None:
        if fh is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass
        failed.append(f"{path}: {error.strerror or error}")


def serve(lock: Lock) -> Tuple[str, str]:
    """Answers hash/put/tar/sync until another line (or none): that line's word and rest."""
    failed: List[str] = []
    word, extra = command()
    while word in ("hash", "put", "tar", "sync"):
        if word == "hash":
            skip, top, roots, dirs, *rest = json.loads(extra)
            for path in dirs:
                os.makedirs(path, exist_ok=True)
            cache = HashCache(os.path.join(os.path.dirname(lock.path), HASH_CACHE))
            found = hashes(skip, top, roots, rest[0] if rest else None, cache)
            cache.save()
            print_hashes(found, sys.stdout)
        elif word == "put":
            path, size = json.loads(extra)
            try:
                put(path, size, failed)
            except EOFError:
                return "", ""
        elif word == "tar":
            try:
                failed += untar(os.path.dirname(lock.path), Chunks(sys.stdin.buffer))
            except EOFError:  # stdin closed in the middle of the archive: the bot is gone
                return "", ""
        else:
            sys.stdout.write(json.dumps({"failed": failed}) + "\n")
            sys.stdout.flush()
            failed = []
        word, extra = command()
    return word, extra


def supervise(lock: Lock, cwd: str, pkg: str, argv: List[str], extra: str) -> None:
    """In the forked child: runs the runner in its own session, output to runner.log,
    its exit status to exit_code, then drops the lock."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(os.path.join(lock.run_dir, "runner.log"),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    with open(os.path.join(lock.run_dir, "runner.pid"), "w") as fh:
        fh.write(f"{os.getpid()}\n")
    env = dict(os.environ)
    env.update(json.loads(extra) if extra else {})  # e.g. the volume's Ray token: never on disk
    paths = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join([pkg, cwd] + paths)
    env["PYTHONUNBUFFERED"] = "1"
    try:
        code = subprocess.call(argv, cwd=cwd, env=env)
    except OSError as exc:
        sys.stderr.write(f"cannot start the runner: {exc}\n")
        code = 127
    tmp = os.path.join(lock.run_dir, "exit_code.tmp")
    with open(tmp, "w") as fh:
        fh.write(f"{code}\n")
    os.replace(tmp, os.path.join(lock.run_dir, "exit_code"))
    lock.locked(lock.release)


def main(args: List[str]) -> None:
    """``LOCK RUN RUN_DIR CWD PKG ARGV...``: the lock, then the bot's lines, then the launch."""
    path, run, run_dir, cwd, pkg = args[:5]
    lock = Lock(path, run, run_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    held = lock.locked(lock.take)
    sys.stdout.write(json.dumps({"held": held} if held else {"locked": run}) + "\n")
    sys.stdout.flush()
    if held:
        sys.exit(3)
    word, extra = serve(lock)
    if word != "launch":
        lock.locked(lock.release)
        sys.exit(0)
    pid = os.fork()
    if pid:
        lock.locked(lambda held: lock.write(pid) if ours(held) else None)
        sys.stdout.write(f"{pid}\n")
        sys.exit(0)
    supervise(lock, cwd, pkg, args[5:], extra)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
