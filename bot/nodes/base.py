"""The ``Node`` protocol: one node, as the node-agnostic dispatch asks of it.

A kind that can run a command on its node and read a file there is a ``Node``; the rest
(what to send, the launcher's lock and launch, following the events, probing and
stopping the runner, fetching the results) is written once above it
(``bot/dispatch/node_dispatcher.py``), and so are a several-node volume's steps on each
node (its card proof, Ray up and down, the head's listing of a corpus only the nodes hold:
``volume_cluster.py``, ``card_proof.py``, ``corpus_head.py``), which also ask where the
node is (``host``, ``python``, ``workdir``, ``ray_port``). A Kubernetes pod is
``kubectl exec -i POD --``; the tests' ``container`` kind is a fake ``exec`` program; an
SSH node is ``ssh/adapter.py``'s ``SSHAdapter``, over the SSH dispatcher's sessions: that
dispatcher is a ``NodeDispatcher`` whose follower (events, probe, exit code, log tail,
stop) runs over the adapter, and which overrides the start and the fetch with its own
(its sessions stream the upload against the node's hashes, meter every copy, hold the
volume nodes' locks, resume a cut fetch and bring an evidence copy home:
docs/architecture.md, "Adding a node kind"). A ``Node`` that reads a file's tail itself
is also a ``TailReader`` (the log tail; the others' is ``tail -c`` through ``run``).

This module imports nothing of ours: the dispatch above and the adapters below both
import it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from bot.node_programs import probe_command, stop_command


class Node(Protocol):
    """One node of a run. Errors reaching the node are ``bot.errors.NodeUnreachable``
    (try again later), anything it answers that cannot be used a ``DispatchError``."""

    @property
    def where(self) -> str:
        """The node in a message's words (``container gpu-1``, ``pod/trainer-0``)."""
        ...

    @property
    def host(self) -> str:
        """The address the node's peers reach it at (a volume's Ray head is
        ``host:port``; the card proof names it)."""
        ...

    @property
    def python(self) -> str:
        """The node's interpreter: the manifest's ``node.python``, else ``python3``."""
        ...

    @property
    def workdir(self) -> str:
        """``node.workdir`` as the manifest writes it (relative or ``~/``: under the node's
        home); "" when it names none."""
        ...

    @property
    def ray_port(self) -> int | None:
        """A volume node's first Ray port (``volume.nodes[].ray_port``; None: the default
        layout, ``bot/dispatch/volume_cluster.py``)."""
        ...

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120.0,
            cap: int | None = None) -> tuple[int, str, str]:
        """Run a shell command on the node, ``stdin`` fed to it: (exit status, stdout,
        stderr). Each stream is read up to ``cap`` bytes (None: the adapter's own cap),
        ``bot.dispatch.node_output.NodeOutputTooLarge`` past it; the command runs in the
        node's home."""
        ...

    def send_archive(self, command: str, stream: bytes, timeout: float = 900.0) -> str:
        """Run ``command`` (the node's launcher) with ``stream`` (its protocol's lines, the
        archive in chunks among them) on its stdin; its stdout. The one transfer of a
        start: a kind meters it as it can."""
        ...

    def read_file(self, path: str, offset: int = 0, size: int | None = None) -> bytes:
        """``size`` bytes (all, when None) of a file on the node from ``offset``; b"" past
        its end. ``FileNotFoundError`` when there is none."""
        ...

    def probe(self, pid: int | None, run_dir: str) -> str:
        """``done``, ``alive``, ``dead``, ``starting`` or ``unknown`` of the runner whose
        run directory on the node is ``run_dir`` (``shell_probe``: the shell's rule)."""
        ...

    def stop(self, pid: int | None, run_dir: str) -> None:
        """Stop that runner (``shell_stop``: its process group, SIGTERM then SIGKILL)."""
        ...


@runtime_checkable
class TailReader(Protocol):
    """A ``Node`` that reads a file's tail itself (the SSH kind, over SFTP: no session of a
    login shell at each look); the others' log tail is ``tail -c`` through ``run``."""

    def read_tail(self, path: str, limit: int) -> bytes:
        """The last ``limit`` bytes of a file on the node (b"" when there is none)."""
        ...


def shell_probe(node: Node, pid: int | None, run_dir: str) -> str:
    """``done``, ``alive``, ``dead`` or ``starting`` of the runner in ``run_dir`` (the shell's
    rule, ``probe_command``); ``unknown`` when the node does not say."""
    code, out, _err = node.run(probe_command(pid, run_dir), timeout=60)
    state = out.strip()
    return state if code == 0 and state in ("done", "alive", "dead", "starting") \
        else "unknown"


def shell_stop(node: Node, pid: int | None, run_dir: str) -> None:
    """SIGTERM to the runner's process group, SIGKILL after a grace (``stop_command``)."""
    node.run(stop_command(pid, run_dir), timeout=60)
