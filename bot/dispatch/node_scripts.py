"""The text that runs on a node: Python scripts for its own interpreter, shell commands.

``LAUNCH_SCRIPT`` takes the workdir's lock, hashes every file under some roots (with the
same skip rules as the local side: ``HASH_FUNCTION``) and starts the runner detached; the
shell commands probe or stop a runner. The scripts run with the node's interpreter
(Python >= 3.9, standard library only); nothing here touches the network or local files.
They must run alone on the node, before the runner package is there, so their few
temp-file-and-rename writes are written out here instead of importing ``runner.files``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

# Runs on the node inside LAUNCH_SCRIPT ("tar"): unpacks the upload's archive stream,
# refusing links, absolute paths and ".." members (bot/dispatch/node_untar.py, a module of
# its own so its tests import it as it is).
UNTAR_FUNCTION = Path(__file__).with_name("node_untar.py").read_text(encoding="utf-8")

# Runs on the node with its own interpreter (Python >= 3.9, standard library only).
# The same skip rules as ``files``: what is never sent (a virtual environment built on the
# node, caches, runs/) is neither hashed (a torch venv is gigabytes) nor removed as stale.
# ``hashes(skip, top, roots)``: root -> relative path -> sha256; LAUNCH_SCRIPT's "hash".
HASH_FUNCTION = r"""
import hashlib, json, os, sys

def hashes(skip, top, roots):
    out = {}
    for root in roots:
        os.makedirs(root, exist_ok=True)
        files = {}
        for base, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in skip
                       and not (base == root and d in top)
                       and not os.path.exists(os.path.join(base, d, "pyvenv.cfg"))]
            for name in names:
                path = os.path.join(base, name)
                if name.endswith(".pyc") or os.path.islink(path) or not os.path.isfile(path):
                    continue
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                files[os.path.relpath(path, root).replace(os.sep, "/")] = h.hexdigest()
        out[root] = files
    return out
"""

# Runs on the node: takes the workdir's lock, then answers the bot's lines on stdin, all
# under the lock and in this one SSH session (each session costs the node's login shell
# start-up, and an SFTP channel is one more session):
# - "hash [skip, top, roots, dirs]" (JSON): makes the directories the upload writes into
#   and prints the hashes of the files under the roots (one JSON line);
# - "put [path, size]" then that many bytes: writes the file (a temporary file renamed);
# - "tar" then one tar archive in chunks ("<n>" line, n bytes; "0" ends it): unpacks it
#   under the workdir (node_untar.py: links, absolute and ".." members refused);
# - "sync": prints the files it could not write since the last sync ({"failed": [...]});
# - "launch": starts the runner detached (its own session, output to runner.log, exit
#   status to exit_code); a JSON object after "launch" on the same line is added to the
#   runner's environment.
# The lock (``dispatch.lock``: run, pid, process start time) names a live process for as
# long as the workdir is in use: this process while the bot uploads, then the runner's
# supervisor; it is dropped when the runner ends or when the bot goes away before the
# launch (stdin closed). A lock whose pid is dead, a zombie or another process is stale.
LAUNCH_SCRIPT = HASH_FUNCTION + UNTAR_FUNCTION + r"""
import fcntl, subprocess, time
lock, run, run_dir, cwd, pkg = sys.argv[1:6]
argv = sys.argv[6:]

def stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []

def alive(held):
    pid = held.get("pid")
    if not isinstance(pid, int) or pid <= 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = stat(pid)
    return not fields or (fields[0] != "Z" and held.get("start") in (None, fields[19]))

def locked(change):
    fd = os.open(lock + ".guard", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            with open(lock) as fh:
                held = json.load(fh)
        except (OSError, ValueError):
            held = None
        return change(held if isinstance(held, dict) else None)
    finally:
        os.close(fd)

def write(pid):
    fields, tmp = stat(pid), "%s.%d.tmp" % (lock, os.getpid())
    with open(tmp, "w") as fh:
        json.dump({"run": run, "pid": pid, "start": fields[19] if fields else None,
                   "run_dir": run_dir,
                   "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, fh)
    os.replace(tmp, lock)

def take(held):
    if held is not None and alive(held):
        return held
    write(os.getpid())

def ours(held):
    return held is not None and held.get("pid") == os.getpid()

def release(held):
    if ours(held):
        os.remove(lock)

os.makedirs(os.path.dirname(lock), exist_ok=True)
held = locked(take)
sys.stdout.write(json.dumps({"held": held} if held else {"locked": run}) + "\n")
sys.stdout.flush()
if held:
    sys.exit(3)
def command():
    return sys.stdin.buffer.readline().decode("utf-8").strip().partition(" ")[::2]

def put(path, size):
    # the bytes are read in full even when the file cannot be written: the next line follows
    tmp, fh, error = "%s.%d.part" % (path, os.getpid()), None, None
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
        failed.append("%s: %s" % (path, error.strerror or error))

failed = []
word, extra = command()
while word in ("hash", "put", "tar", "sync"):
    if word == "hash":
        skip, top, roots, dirs = json.loads(extra)
        for path in dirs:
            os.makedirs(path, exist_ok=True)
        sys.stdout.write(json.dumps(hashes(skip, top, roots)) + "\n")
        sys.stdout.flush()
    elif word == "put":
        try:
            put(*json.loads(extra))
        except EOFError:
            word = ""
            break
    elif word == "tar":
        try:
            failed += untar(os.path.dirname(lock), Chunks(sys.stdin.buffer))
        except EOFError:  # stdin closed in the middle of the archive: the bot is gone
            word = ""
            break
    else:
        sys.stdout.write(json.dumps({"failed": failed}) + "\n")
        sys.stdout.flush()
        failed = []
    word, extra = command()
if word != "launch":
    locked(release)
    sys.exit(0)
pid = os.fork()
if pid:
    locked(lambda held: write(pid) if ours(held) else None)
    sys.stdout.write("%d\n" % pid)
    sys.exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDONLY)
log = os.open(os.path.join(run_dir, "runner.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.dup2(null, 0)
os.dup2(log, 1)
os.dup2(log, 2)
with open(os.path.join(run_dir, "runner.pid"), "w") as fh:
    fh.write("%d\n" % os.getpid())
env = dict(os.environ)
env.update(json.loads(extra) if extra else {})  # e.g. the volume's Ray token: never on disk
paths = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
env["PYTHONPATH"] = os.pathsep.join([pkg, cwd] + paths)
env["PYTHONUNBUFFERED"] = "1"
try:
    code = subprocess.call(argv, cwd=cwd, env=env)
except OSError as exc:
    sys.stderr.write("cannot start the runner: %s\n" % exc)
    code = 127
tmp = os.path.join(run_dir, "exit_code.tmp")
with open(tmp, "w") as fh:
    fh.write("%d\n" % code)
os.replace(tmp, os.path.join(run_dir, "exit_code"))
locked(release)
os._exit(0)
"""


# Runs on a volume node other than the head, launched by ``LAUNCH_SCRIPT`` once that node's
# Ray has started: as long as the Ray process group named in ``<HOLD_ENV dir>/preflight.pgid``
# lives (the file is removed when it is stopped), this process, and with it the launcher's
# supervisor, holds the node's workdir lock, so no other dispatch writes under its workers.
HOLD_ENV = "PREFLIGHT_HOLD_RAY"
HOLD_SCRIPT = r"""
import os, stat, sys, time
path = os.path.join(os.environ.get("PREFLIGHT_HOLD_RAY", ""), "preflight.pgid")
try:  # a group named in a temp dir that is not ours alone is nobody's word (ray_cluster.py)
    st = os.lstat(os.path.dirname(path))
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        sys.exit(0)
    with open(path) as fh:
        group = int(fh.read())
except (OSError, ValueError):
    sys.exit(0)
while os.path.exists(path):
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        break
    except PermissionError:
        pass
    time.sleep(1)
"""


def python_command(python: str, script: str, *args: str) -> str:
    """The shell command that runs ``script`` with the node's ``python`` and ``args``."""
    return " ".join(shlex.quote(a) for a in (python, "-c", script, *args))


def _pid_of(pid: Any, run_dir: str) -> str:
    """Shell text for the runner's pid: the layout's, else the node's ``runner.pid``."""
    if isinstance(pid, int) and pid > 1:
        return str(pid)
    return f"$(cat {shlex.quote(run_dir)}/runner.pid 2>/dev/null)"


def probe_command(pid: int | None, run_dir: str) -> str:
    """Prints ``done`` (exit_code written), ``alive`` (running, not a zombie), ``dead``, or
    ``starting`` (no pid known anywhere yet: not dead, the events will tell)."""
    quoted = shlex.quote(run_dir)
    return (f"p={_pid_of(pid, run_dir)}; if [ -e {quoted}/exit_code ]; then echo done; "
            "elif [ -z \"$p\" ]; then echo starting; "
            "elif kill -0 \"$p\" 2>/dev/null && [ \"$(cut -d')' -f2 /proc/$p/stat "
            "2>/dev/null | cut -c2)\" != Z ]; then echo alive; else echo dead; fi")


def stop_command(pid: int | None, run_dir: str, grace_s: int = 10) -> str:
    """SIGTERM to the runner's whole process group (its own session), SIGKILL to what is
    left of it after ``grace_s`` seconds (the runner writes run.finished on SIGTERM)."""
    return (f"p={_pid_of(pid, run_dir)}; [ \"${{p:-0}}\" -gt 1 ] 2>/dev/null || exit 0; "
            "kill -TERM -- \"-$p\" 2>/dev/null || exit 0; "
            f"for i in $(seq {grace_s * 5}); do kill -0 -- \"-$p\" 2>/dev/null || exit 0; "
            "sleep 0.2; done; kill -KILL -- \"-$p\" 2>/dev/null; true")
