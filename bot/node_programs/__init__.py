"""What runs on a node, sent as text: Python programs for its own interpreter, shell commands.

Each program is a module of this package (stdlib only, Python >= 3.9, checked by ruff and
mypy as it is, imported by the tests as it is): ``launcher.py``, ``untar.py``,
``ray_hold.py``, ``corpus_listing.py``. The bot imports their pure rules too (the
launcher's ``running``, the listing's ``listing_digest``). ``LAUNCH_SCRIPT`` (``launcher.py``
with ``untar.py`` in front) takes the
workdir's lock, hashes every file under some roots and starts the runner detached; the
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
# refusing links, absolute paths and ".." members (bot/node_programs/untar.py, a module of
# its own so its tests import it as it is).
UNTAR_FUNCTION = Path(__file__).with_name("untar.py").read_text(encoding="utf-8")

# Runs on the node: takes the workdir's lock, then answers the bot's lines on stdin (hash,
# put, tar, sync) and launches the runner detached (bot/node_programs/launcher.py, a module
# of its own that ruff, mypy and the tests read as it is; its docstring says the protocol).
# The node's memory of file digests (bot/node_programs/hashcache.py), in front of the
# launcher and of the corpus listing.
HASH_CACHE_TEXT = Path(__file__).with_name("hashcache.py").read_text(encoding="utf-8")
LAUNCH_SCRIPT = UNTAR_FUNCTION + HASH_CACHE_TEXT + Path(__file__).with_name(
    "launcher.py").read_text(encoding="utf-8")


# A volume's Ray on a node: started and stopped in a process group of its own, and, on a
# node other than the head, held by what ``LAUNCH_SCRIPT`` launches there once its Ray has
# started (``ray_hold.py``'s hold, ``HOLD_ENV`` naming the Ray temp dir): it lives as long
# as that Ray does, and with it the launcher's supervisor, which holds the workdir lock.
NODE_RAY = Path(__file__).with_name("ray_hold.py").read_text(encoding="utf-8")

# Runs on a node: lists and checksums a corpus already there (``corpus_listing.py``).
NODE_CORPUS_SCRIPT = HASH_CACHE_TEXT + Path(__file__).with_name("corpus_listing.py").read_text(
    encoding="utf-8")


# Runs on a node: a finished run's evidence copy (or run directory) as one tar stream on
# stdout, leaving out what the bot already holds (``fetch_stream.py``).
FETCH_STREAM = Path(__file__).with_name("fetch_stream.py").read_text(encoding="utf-8")


def fetch_command(python: str, root: str, *skip: str) -> str:
    """``FETCH_STREAM`` run by the node's ``python`` without ``site`` (``-S``): a site's
    ``sitecustomize`` printing on stdout would garble the stream."""
    return " ".join(shlex.quote(a) for a in (python, "-S", "-c", FETCH_STREAM, root, *skip))


def python_command(python: str, script: str, *args: str) -> str:
    """The shell command that runs ``script`` with the node's ``python`` and ``args``."""
    return " ".join(shlex.quote(a) for a in (python, "-c", script, *args))


def launcher_command(python: str, *args: str) -> str:
    """``LAUNCH_SCRIPT`` run by the node's ``python`` without ``site`` (``-S``): it needs
    the standard library only, a site's ``.pth`` files and ``sitecustomize`` would cost
    every dispatch their import (20-50 ms), and one printing on stdout would garble the
    launcher's answers. What it launches (the runner) gets the full interpreter."""
    return " ".join(shlex.quote(a) for a in (python, "-S", "-c", LAUNCH_SCRIPT, *args))


def _pid_of(pid: Any, run_dir: str) -> str:
    """Shell text for the runner's pid: the layout's, else the node's ``runner.pid``."""
    if isinstance(pid, int) and pid > 1:
        return str(pid)
    return f"$(cat {shlex.quote(run_dir)}/runner.pid 2>/dev/null)"


def probe_command(pid: int | None, run_dir: str) -> str:
    """Prints ``done`` (exit_code written), ``alive`` (the pid answers ``kill -0``), ``dead``,
    or ``starting`` (no pid known anywhere yet: not dead, the events will tell). The SSH
    dispatcher runs it only on a node without /proc: where there is one, it reads the
    runner's /proc entry over SFTP by the launcher's rule (``launcher.stat_fields``: a
    zombie is dead), so this command has no /proc to look at."""
    quoted = shlex.quote(run_dir)
    return (f"p={_pid_of(pid, run_dir)}; if [ -e {quoted}/exit_code ]; then echo done; "
            "elif [ -z \"$p\" ]; then echo starting; "
            "elif kill -0 \"$p\" 2>/dev/null; then echo alive; else echo dead; fi")


def stop_command(pid: int | None, run_dir: str, grace_s: int = 10) -> str:
    """SIGTERM to the runner's whole process group (its own session), SIGKILL to what is
    left of it after ``grace_s`` seconds (the runner writes run.finished on SIGTERM)."""
    return (f"p={_pid_of(pid, run_dir)}; [ \"${{p:-0}}\" -gt 1 ] 2>/dev/null || exit 0; "
            "kill -TERM -- \"-$p\" 2>/dev/null || exit 0; "
            f"for i in $(seq {grace_s * 5}); do kill -0 -- \"-$p\" 2>/dev/null || exit 0; "
            "sleep 0.2; done; kill -KILL -- \"-$p\" 2>/dev/null; true")
