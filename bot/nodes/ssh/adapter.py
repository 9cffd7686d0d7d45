"""SSHAdapter: the ``Node`` protocol (``bot/nodes/base.py``) on one SSH node, over the
dispatcher's sessions (``SSHNodes``: one connection per node, ``guarded``'s rule of
"answered" against "unreachable", the private event loop thread).

It is the SSH dispatcher's ``node_of``: the follower (``NodeDispatcher``'s: events, probe,
exit code, log tail, stop) and the node-agnostic steps of a several-node volume (its card
proof, Ray up and down, the head's corpus listing: ``bot/dispatch/volume_cluster.py``,
``card_proof.py``, ``corpus_head.py``) go through here. Its commands go through the
sessions' ``run`` (so a dispatcher that wraps ``run`` sees them all); ``read_file`` reads
over SFTP (the sessions' ``_read``), ``read_tail`` a file's end over SFTP, ``probe`` the
runner's /proc entry over SFTP (the shell's rule where the node has no /proc). After a
drop, ``read_file`` and ``probe`` raise ``NodeUnreachable`` while the backoff says not
to try yet (the follower's look is then "no contact", the runner unknown, not dead).
"""

from __future__ import annotations

from typing import Any

from bot.dispatch.node_output import NODE_OUTPUT_CAP, run_capped
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError
from bot.manifest.nodes import NodeSpec
from bot.nodes.base import shell_probe, shell_stop
from bot.nodes.ssh.node import SSHNodes


class SSHAdapter:
    """One node of ``sessions`` (an ``SSHNodes``, the SSH dispatcher itself), as a
    ``Node``."""

    def __init__(self, sessions: SSHNodes, node: SSHNode) -> None:
        self.sessions = sessions
        self.node = node

    @classmethod
    def of(cls, sessions: SSHNodes, spec: NodeSpec) -> SSHAdapter:
        """The node of a manifest's node section (``node.host`` and ``node.workdir``
        required: a DispatchError naming the field)."""
        return cls(sessions, SSHNode.from_dict(spec.model_dump(mode="json")))

    @property
    def where(self) -> str:
        return self.node.where

    @property
    def host(self) -> str:
        return self.node.host

    @property
    def python(self) -> str:
        return self.node.python

    @property
    def workdir(self) -> str:
        return self.node.workdir

    @property
    def ray_port(self) -> int | None:
        return self.node.ray_port

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120.0,
            cap: int | None = None) -> tuple[int, str, str]:
        text = stdin.decode("utf-8", errors="replace")
        if cap is None:
            return self.sessions.run(self.node, command, text, timeout)
        return self.sessions.run(self.node, command, text, timeout, cap=cap)

    def send_archive(self, command: str, stream: bytes, timeout: float = 900.0) -> str:
        async def work(conn: Any) -> tuple[int, str, str]:
            code, out, err = await run_capped(conn, command, where=self.where, stdin=stream,
                                              cap=NODE_OUTPUT_CAP)
            if code is None:
                raise ConnectionResetError("the launcher ended with no exit status")
            return code, out, err

        code, out, err = self.sessions._call(self.sessions.guarded(self.node, work), timeout)
        if code != 0:
            raise DispatchError(f"{self.where}: the launcher ended with status {code}: "
                                f"{err.strip()[-500:]}")
        return out

    def read_file(self, path: str, offset: int = 0, size: int | None = None) -> bytes:
        """Over SFTP (``SSHSessions._read``); ``NodeUnreachable`` while the backoff after a
        drop says not to try yet."""
        self.sessions._may_try(self.node)
        data = self.sessions._call(
            self.sessions._read(self.node, path, offset, -1 if size is None else size), 60)
        if data is None:
            raise FileNotFoundError(path)
        return data

    def read_tail(self, path: str, limit: int) -> bytes:
        """The last ``limit`` bytes of a node's file over SFTP (``TailReader``)."""
        return self.sessions._call(self.sessions._read_tail(self.node, path, limit), 60)

    def probe(self, pid: int | None, run_dir: str) -> str:
        """The runner's /proc entry read over SFTP, the shell's rule where the node has no
        /proc; ``NodeUnreachable`` while the backoff after a drop says not to try yet."""
        self.sessions._may_try(self.node)
        state = self.sessions._call(self.sessions._probe_files(self.node, pid, run_dir), 60)
        return state if state is not None else shell_probe(self, pid, run_dir)

    def stop(self, pid: int | None, run_dir: str) -> None:
        shell_stop(self, pid, run_dir)
