"""What the SSH dispatcher sends to a node and runs there (no network here).

- ``SSHNode``: the manifest's node section for ``node.kind: ssh``. ``node_section`` takes it
  from the handle (the service passes it), else from its launch plan (``plan_of``);
  ``locate`` adds the run's layout on the node that ``start`` kept in ``remote.json``, so a
  restarted bot finds its runs again.
- ``UploadPlan``: where each local file goes on the node (the ``runner`` package, the
  project, inputs outside it, the evidence copy), which files must be sent or removed given
  the node's hashes, and the run's spec with its paths rewritten for the node.
- The node-side text lives in ``bot/node_programs/__init__.py`` (scripts and shell commands).
- ``verify_fetched``: checks the evidence copy once it is back on the bot host.

``bot/nodes/ssh/dispatcher.py`` does the SSH work with these; this module only touches local files.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import runner
from bot.dispatch.base import RunHandle
from bot.dispatch.calibration_sample import calibration_copy
from bot.dispatch.corpus import (
    Reference,
    corpus_command,
    corpus_node_only,
    corpus_on_nodes,
    head_rows,
    listing_header,
    reference_rows,
)
from bot.dispatch.inputs_check import CheckedInputs, checked_files, recheck_inputs
from bot.dispatch.plan import plan_of
from bot.errors import DispatchError
from bot.manifest.nodes import is_remote_node
from bot.node_programs import NODE_RAY, launcher_command
from runner.evidence import file_sha256
from runner.files import write_json_atomic

RUNNER_PACKAGE = Path(runner.__file__).resolve().parent
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "__pycache__", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", "node_modules", ".tox", ".eggs",
                       ".hypothesis", ".cache", ".idea", ".vscode"})
SKIP_TOP = frozenset({"runs", "state", "evidence"})

@dataclass(frozen=True)
class SSHNode:
    host: str
    workdir: str
    port: int = 22
    user: str | None = None
    python: str = "python3"
    host_key_fingerprint: str | None = None
    ray_port: int | None = None  # a volume node's first Ray port (None: the default layout)

    @classmethod
    def from_dict(cls, node: dict[str, Any]) -> SSHNode:
        require_address(node)
        return cls(host=str(node["host"]), workdir=str(node["workdir"]),
                   port=int(node.get("port") or 22), user=node.get("user") or None,
                   python=str(node.get("python") or "python3"),
                   host_key_fingerprint=node.get("host_key_fingerprint") or None,
                   ray_port=int(node["ray_port"]) if node.get("ray_port") else None)

    @property
    def where(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"


def require_address(node: dict[str, Any]) -> None:
    """A node reached over the network names its ``host`` and ``workdir`` (a DispatchError
    naming the first missing)."""
    missing = [k for k in ("host", "workdir") if not node.get(k)]
    if missing:
        raise DispatchError(f"node.{missing[0]}: required for a node reached over the "
                            "network")


ConnKey = tuple[str, int, Optional[str], Optional[str]]


def conn_key(node: SSHNode) -> ConnKey:
    """A connection is shared only by nodes with the same address, user and trust rule."""
    return (node.host, node.port, node.user, node.host_key_fingerprint)


def host_key_refused(node: SSHNode, known_hosts: str | None, reason: str) -> DispatchError:
    source = (f"the pinned node.host_key_fingerprint {node.host_key_fingerprint}"
              if node.host_key_fingerprint else
              f"known_hosts ({known_hosts or '~/.ssh/known_hosts'})")
    return DispatchError(
        f"{node.where}: host key refused: it does not match {source} ({reason}). An unknown "
        "or changed key is never accepted silently: check the key with the provider, then "
        "add it to known_hosts or pin node.host_key_fingerprint")


class Backoff:
    """Retry delays per connection: ``first`` seconds, doubling up to ``cap``."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap = first, cap
        self._state: dict[ConnKey, tuple[int, float]] = {}  # key -> (failures, not before)

    def may_try(self, key: ConnKey) -> bool:
        return self.wait_s(key) <= 0

    def wait_s(self, key: ConnKey) -> float:
        """Seconds before the next try of ``key`` is due (0 or less: now)."""
        return self._state.get(key, (0, 0.0))[1] - time.monotonic()

    def delay(self, failures: int) -> float:
        """The wait after ``failures + 1`` failures in a row."""
        return float(min(self.cap, self.first * (2 ** failures)))

    def failed(self, key: ConnKey) -> None:
        failures = self._state.get(key, (0, 0.0))[0]
        self._state[key] = (failures + 1, time.monotonic() + self.delay(failures))

    def succeeded(self, key: ConnKey) -> None:
        self._state.pop(key, None)

    def clear(self) -> None:
        self._state.clear()


def mirror(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` of the local copy of a remote file (never through a
    symbolic link: ``O_NOFOLLOW``; a link there is an error naming the path)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise DispatchError(f"{path}: cannot write the local copy of the node's events "
                            f"({exc.strerror}); it must be a regular file") from exc
    with os.fdopen(fd, "wb") as fh:  # no O_TRUNC: what is before ``offset`` stays
        fh.seek(offset)
        fh.write(data)


def node_section(handle: RunHandle) -> dict[str, Any]:
    """The manifest's node section: the handle's, else its launch plan's (``plan_of``)."""
    if handle.node is not None:
        return _ssh_only(handle.node, f"run {handle.run_id}")
    where = f"{handle.run_dir}/manifest.yaml" if handle.plan is None \
        else f"run {handle.run_id}"
    node = plan_of(handle).node
    return _ssh_only(node.model_dump(mode="json") if node is not None else None, where)


def locate(handle: RunHandle) -> tuple[SSHNode, dict[str, Any]]:
    """The node (the handle's, else the one ``remote.json`` recorded) and the run's layout."""
    path = handle.run_dir / "remote.json"
    try:
        layout: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DispatchError(f"run {handle.run_id}: {path} is missing or unreadable; "
                            "the run was never dispatched over SSH") from exc
    # No pid yet: written just before the launch; the runner may be starting (see probe).
    missing = [k for k in ("node", "run_dir") if not isinstance(layout, dict)
               or layout.get(k) in (None, "")]
    if missing:
        raise DispatchError(f"run {handle.run_id}: {path} lacks {', '.join(missing)}; it was "
                            "not written by a dispatch (restore it or resume the run)")
    node = handle.node if handle.node is not None else layout["node"]
    if not isinstance(node, dict):
        raise DispatchError(f"run {handle.run_id}: {path}: node is not a mapping")
    return SSHNode.from_dict(node), layout


def _ssh_only(node: Any, where: str) -> dict[str, Any]:
    """A node section this upload can reach: another machine (its kind's ``is_remote``)."""
    if not isinstance(node, dict) or not is_remote_node(node):
        kind = node.get("kind") if isinstance(node, dict) else None
        raise DispatchError(f"{where}: node.kind {kind!r} is not a node reached over the "
                            "network; its own kind's dispatcher runs it")
    return node


def write_layout(path: Path, layout: dict[str, Any]) -> None:
    """``remote.json``, replaced atomically: a crash leaves the old or the new, never half."""
    write_json_atomic(path, layout)


@dataclass
class Changes:
    """What one upload must do: files to send, remote files to remove, bytes by kind."""

    send: list[tuple[Path, str]] = field(default_factory=list)  # (local path, remote path)
    remove: list[str] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=lambda: {"runner": 0, "project": 0})


class UploadPlan:
    """Where each local file goes on the node, and the spec with its paths rewritten."""

    def __init__(self, workdir: str, handle: RunHandle, package: Path,
                 spec: dict[str, Any]) -> None:
        self.workdir = workdir
        self.spec = spec
        project = spec.get("project", {}).get("dir") or handle.project_dir
        self.local_project = Path(project).resolve()
        tag = _tag(str(self.local_project))
        self.remote_project = f"{workdir}/projects/{self.local_project.name}-{tag}"
        self.remote_pkg_root = f"{workdir}/runner-pkg"
        self.remote_run_dir = f"{workdir}/runs/{handle.run_id}"
        self.lock = f"{workdir}/dispatch.lock"
        self.run_id, self.resume = handle.run_id, handle.resume
        self.package = package
        self.skip = {handle.run_dir.parent.resolve()}
        # project.exclude, resolved by the bot at submission: never sent, never hashed
        self.skip |= {Path(str(p)).resolve()
                      for p in spec.get("project", {}).get("exclude") or []}
        self.extra: dict[Path, str] = {}
        self._trees: list[tuple[str, str, dict[str, tuple[Path, str | None]]]] | None = None
        # The inputs as checked at submission, checked again now (a DispatchError when the
        # folder or a file was swapped meanwhile); outside the project, exactly those go.
        # A corpus only the nodes hold has no copy here: nothing of it is read on this host.
        self.run_dir = handle.run_dir
        self.node_only = corpus_node_only(handle, spec)
        self.head: str | None = None  # where the reference listing was made (node_only)
        self.inputs = CheckedInputs(Path(str(spec["inputs"]["dir"])), {}) if self.node_only \
            else recheck_inputs(handle.run_dir, spec)
        inputs = self.inputs.dir
        # A corpus already on the node (volume.inputs.on_nodes) is checked there, never sent
        self.on_nodes = corpus_on_nodes(handle, spec)
        if self.on_nodes:
            self.skip.add(inputs)
        elif not _under(inputs, self.local_project):
            self.extra[inputs] = f"{workdir}/inputs/{inputs.name}-{_tag(str(inputs))}"
        copy_to = (spec.get("results") or {}).get("copy_to")
        self.evidence: dict[str, Any] = {}
        if copy_to and "://" not in copy_to:
            local = Path(copy_to).resolve()
            self.skip.add(local)
            self.evidence = {"local": str(local),
                             "remote": f"{workdir}/evidence/{_tag(str(local))}"}
        # a pilot's calibration: the volume's inputs where its node finds them, or a sample
        self.calibration = calibration_copy(spec, plan_of(handle).on_nodes,
                                            self.remote_run_dir, self._carried)

    def roots(self) -> list[str]:
        return [self.remote_pkg_root, self.remote_project, *self.extra.values()]

    def trees(self) -> list[tuple[str, str, dict[str, tuple[Path, str | None]]]]:
        """(kind, remote root, relative path -> (local path, sha256 or None: read only when
        the node holds a file of that name, ``changes``)); listed once per plan."""
        if self._trees is not None:
            return self._trees
        out = [("runner", self.remote_pkg_root, {f"runner/{rel}": v for rel, v in
                                                files(self.package, set(), top=False).items()}),
               ("project", self.remote_project, files(self.local_project, self.skip))]
        for local, remote in self.extra.items():
            tree: dict[str, tuple[Path, str | None]] = (
                dict(checked_files(self.inputs)) if local == self.inputs.dir
                else files(local, self.skip))
            out.append(("project", remote, tree))
        if self.calibration is not None and self.calibration.remote:
            out.append(("project", self.calibration.remote,
                        {name: (path, None) for name, path in self.calibration.files.items()}))
        self._trees = out
        return out

    def remote_dirs(self) -> list[str]:
        """Every directory the upload may write into: the run's, and each one holding a
        file of the local trees (the launcher makes them, with the hashes)."""
        dirs = {posixpath.dirname(f"{root}/{rel}") for _kind, root, local in self.trees()
                for rel in local}
        return sorted(dirs | {self.remote_run_dir})

    def changes(self, remote: dict[str, dict[str, str]]) -> Changes:
        """Given the node's hashes (root -> relative path -> sha256), what to send and remove."""
        out = Changes()
        for kind, root, local in self.trees():
            have = remote.get(root, {})
            for rel, (path, digest) in local.items():
                theirs = have.get(rel)
                # a file the node lacks is sent unread here (a first dispatch hashes nothing)
                if theirs is None or theirs != (digest or file_sha256(str(path))):
                    out.send.append((path, f"{root}/{rel}"))
                    out.sent[kind] += path.stat().st_size
            out.remove += [f"{root}/{rel}" for rel in have if rel not in local]
        return out

    def map_path(self, value: str | None) -> str | None:
        if not value:
            return value
        path = Path(value).resolve()
        for local, remote in [(self.local_project, self.remote_project), *self.extra.items()]:
            if _under(path, local):
                rel = path.relative_to(local).as_posix()
                return remote if rel == "." else f"{remote}/{rel}"
        raise DispatchError(f"{value}: outside project.dir {self.local_project}; "
                            "the node only receives the project directory")

    def rewrite_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = json.loads(json.dumps(self.spec))
        spec["project"]["dir"] = self.remote_project
        spec["project"]["requirements"] = self.map_path(spec["project"].get("requirements"))
        spec["inputs"]["dir"] = self.on_nodes or self.map_path(spec["inputs"]["dir"])
        if self.evidence:
            spec["results"]["copy_to"] = self.evidence["remote"]
        if self.calibration is not None:
            spec["calibration"] = self.calibration.calibration
        return spec

    def _carried(self, local: Path) -> str | None:
        """The node's path of a bot-host folder this upload carries, else None."""
        if any(_under(local, left_out) for left_out in self.skip):
            return None
        try:
            return self.map_path(str(local))
        except DispatchError:
            return None

    def run_files(self, handle: RunHandle) -> dict[str, bytes]:
        """The run's own files on the node: the spec rewritten for it and the manifest as
        submitted (the launch plan's, ``plan_of``)."""
        remote_spec = json.dumps(self.rewrite_spec(), indent=2, sort_keys=True).encode()
        return {f"{self.remote_run_dir}/spec.json": remote_spec,
                f"{self.remote_run_dir}/manifest.yaml":
                    plan_of(handle).manifest_text.encode("utf-8")}

    def hash_request(self) -> str:
        """The launcher's stdin line asking it to make ``remote_dirs()`` and print the
        node's hashes of every file under ``roots()``: one JSON line (for ``changes``),
        under the workdir's lock."""
        return "hash " + json.dumps([sorted(SKIP_DIRS), sorted(SKIP_TOP), self.roots(),
                                     self.remote_dirs(), self.excluded()]) + "\n"

    def excluded(self) -> list[str]:
        """The node paths of what is never sent from the project (``project.exclude``, a
        pilot's volume corpus, the runs and evidence folders): the node neither hashes
        them nor has them removed as stale (a volume's corpus sent earlier stays)."""
        return sorted(f"{self.remote_project}/{path.relative_to(self.local_project).as_posix()}"
                      for path in self.skip
                      if path != self.local_project and _under(path, self.local_project))

    def hold_command(self, python: str) -> str:
        """Like ``launch_command``, but what it launches holds the workdir's lock while the
        node's Ray lives (a volume node other than the head: ``ray_hold.py``'s hold)."""
        return launcher_command(python, self.lock, self.run_id, self.remote_run_dir,
                                self.remote_project, self.remote_pkg_root,
                                python, "-c", NODE_RAY, "hold")

    def launch_command(self, python: str, resume: bool) -> str:
        """Takes the workdir's lock (prints a JSON line), then on ``launch`` on its stdin
        starts the runner detached on the node and prints its pid."""
        run_dir = self.remote_run_dir
        argv = [python, "-m", "runner", f"{run_dir}/spec.json", "--run-dir", run_dir]
        argv += ["--resume"] if resume else []
        return launcher_command(python, self.lock, self.run_id, run_dir,
                                self.remote_project, self.remote_pkg_root, *argv)

    def corpus_check(self, python: str) -> tuple[str, Reference]:
        """The command listing the node's copy of the corpus (``on_nodes``) and what it
        must equal (the bot's checked copy; for a corpus only the nodes hold, the head
        node's listing of this dispatch, ``corpus_head.py``, whose rows are read only for
        a node whose copy differs)."""
        assert self.on_nodes
        if self.node_only:
            header = listing_header(self.run_dir)
            self.head = str(header.get("node") or "volume.nodes[0]")
            run_dir = self.run_dir
            reference = Reference(str(header["digest"]), int(header.get("count") or 0),
                                  lambda: head_rows(run_dir))
        else:
            reference = Reference.of(reference_rows(self.inputs))
        pattern = str((self.spec.get("inputs") or {}).get("pattern") or "*")
        return corpus_command(python, self.on_nodes, pattern, reference.digest,
                              self.workdir), reference

    def layout(self, node: SSHNode, sent: dict[str, int]) -> dict[str, Any]:
        """``remote.json`` before the launch (no pid yet: a restarted bot still finds it)."""
        return {"node": {**node.__dict__}, "run_dir": self.remote_run_dir, "pid": None,
                "lock": self.lock, "evidence": self.evidence, "uploaded": sent}


def files(root: Path, skip: set[Path], *,
          top: bool = True) -> dict[str, tuple[Path, str | None]]:
    """Regular files under ``root`` (relative POSIX path -> (path, None: its sha256 is read
    only to compare it with the node's copy, ``UploadPlan.changes``)), junk skipped."""
    out: dict[str, tuple[Path, str | None]] = {}
    for base, dirs, names in os.walk(root):
        here = Path(base)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS
                         and not (top and here == root and d in SKIP_TOP)
                         and (here / d).resolve() not in skip
                         and not (here / d / "pyvenv.cfg").exists())
        for name in sorted(names):
            path = here / name
            # ".git" as a file: a worktree's or a submodule's pointer, never sent either
            if (name.endswith(".pyc") or name in SKIP_DIRS or path.is_symlink()
                    or not path.is_file() or path in skip):
                continue
            out[path.relative_to(root).as_posix()] = (path, None)
    return out




def verify_fetched(handle: RunHandle, dest: Path) -> None:
    """Verify the evidence copy brought back to ``dest``; the report goes to the run dir."""
    from runner.evidence import verify_evidence

    report = verify_evidence(str(dest))
    # temporary file + rename: a link left under that name is replaced, never followed
    write_json_atomic(handle.run_dir / "evidence-fetch.json", report.to_dict())
    if not report.ok:
        raise DispatchError(f"evidence of {handle.run_id} fetched to {dest} but it does not "
                            f"verify: {'; '.join(report.problems[:5])}")


def _tag(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents
