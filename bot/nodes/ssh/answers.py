"""What a node's launcher answers (``bot/node_programs/launcher.py``), checked here before
the SSH dispatch trusts any of it: its lock (ours, or who holds the workdir), the pid it
launched, and its file hashes (line by line, each relative path checked, the files
counted). A node's answer is the team's once its code ran there (docs/security.md)."""

from __future__ import annotations

from bot.dispatch.base import json_object
from bot.dispatch.node_names import node_relpath
from bot.errors import DispatchError, NodeUnreachable


def lock_holder(reply: str, node: str, workdir: str, python: str, run_id: str = "") -> None:
    """Checks the first line the launcher printed: the lock is ours, or who holds it. Held
    by this very run: the launcher of a dispatch whose connection dropped, about to see its
    stdin close and let go; ``NodeUnreachable`` makes the dispatch try again."""
    answer = json_object(reply) or {}
    if answer.get("locked"):
        return
    held = answer.get("held")
    if not isinstance(held, dict):
        raise DispatchError(f"{node}: node.python {python!r} did not answer the launcher "
                            f"(got {reply.strip()[:200]!r}); is it Python >= 3.9 on a POSIX "
                            "system and does the login print nothing on stdout?")
    if run_id and held.get("run") == run_id:
        raise NodeUnreachable(f"{node}: the workdir lock is still held by this run's earlier "
                              "launcher (its connection dropped); trying again")
    raise DispatchError(
        f"{node}: workdir {workdir} is in use by run {held.get('run')} (pid {held.get('pid')} "
        f"alive on the node since {held.get('since')}, run directory {held.get('run_dir')}): "
        "a dispatch now would overwrite or delete files under a working runner. Wait for "
        "that run to end (or stop it), or give this manifest another node.workdir")


def launched_pid(out: str, node: str) -> int:
    """The pid the launcher printed last (its runner's supervisor, a session leader)."""
    try:
        return int(out.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise DispatchError(f"{node}: the launcher printed no pid: {out!r}") from exc


MAX_NODE_FILES = 2_000_000  # files a node's hash answer may name, all roots together


class HashAnswer:
    """The launcher's answer to ``hash_request``, line by line (``launcher.print_hashes``:
    ``{"root", "files"}`` lines, then ``{"end": <files>}``): type-checked, each relative
    path's parts checked by ``node_relpath`` (the upload removes what the node lists and
    the bot does not have), only the ``roots`` asked kept, at most ``max_files`` files;
    a DispatchError naming the node otherwise."""

    def __init__(self, node: str, python: str, roots: list[str] | None = None,
                 max_files: int = MAX_NODE_FILES) -> None:
        self.node, self.python, self.roots, self.max_files = node, python, roots, max_files
        self.hashes: dict[str, dict[str, str]] = {}
        self.files = 0
        self.ended = False

    def feed(self, line: str) -> bool:
        """One line of the answer; True once its end line came (and the count agrees)."""
        answer = json_object(line)
        if answer is None:
            raise DispatchError(f"{self.node}: node.python {self.python!r} did not print the "
                                f"file hashes (got {line.strip()[:200]!r}); is it Python >= "
                                "3.9 and does the login print nothing on stdout?")
        if "end" in answer:
            if answer["end"] != self.files:
                raise DispatchError(f"{self.node}: the file hashes end with {answer['end']!r} "
                                    f"file(s), {self.files} were listed: the node's answer is "
                                    "refused")
            self.ended = True
            return True
        root, files = answer.get("root"), answer.get("files")
        if not isinstance(root, str) or not isinstance(files, dict) \
                or not all(isinstance(v, str) for v in files.values()):
            raise DispatchError(f"{self.node}: the file hashes under {str(root)[:200]!r} are "
                                "not a mapping of relative paths to SHA-256 digests: the "
                                "node's answer is refused")
        self.files += len(files)
        if self.files > self.max_files:
            raise DispatchError(f"{self.node}: the node lists more than {self.max_files:,} "
                                "files under the upload's folders: the node's answer is "
                                "refused (project.exclude leaves a folder out)")
        if self.roots is not None and root not in self.roots:
            return False
        checked = self.hashes.setdefault(root, {})
        checked.update({node_relpath(rel, self.node, root): digest
                        for rel, digest in files.items()})
        return False


def parse_hashes(out: str, node: str, python: str,
                 roots: list[str] | None = None) -> dict[str, dict[str, str]]:
    """The whole hash answer as text (its lines), checked by ``HashAnswer``."""
    answer = HashAnswer(node, python, roots)
    for line in out.splitlines() or [""]:
        if answer.feed(line):
            return answer.hashes
    raise DispatchError(f"{node}: the file hashes ended before their end line: the node's "
                        "answer is refused")
