"""The tests' third node kind, ``container``: this one module, plus one registry line
(``bot.nodes.registry.register(container_kind(root))``; ``registered`` for a test).

Its node section names a container (``container: box-1``, a folder under ``root``
standing for it); its ``Node`` runs every command through the fake ``exec`` program
(``tests/bot/fake_exec.py``), as a Kubernetes kind would through ``kubectl exec -i``; the
dispatch is the node-agnostic one (``bot/dispatch/node_dispatcher.py``). Nothing in
``bot/`` names it."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import ClassVar, Literal

from bot.dispatch.node_dispatcher import NodeDispatcher
from bot.dispatch.node_output import NODE_OUTPUT_CAP, too_large
from bot.dispatch.volume_cluster import RayNodeOf, default_ray_node
from bot.errors import DispatchError, NodeUnreachable
from bot.manifest.nodes import NodeSpec
from bot.manifest.types import NonEmpty
from bot.nodes.base import shell_probe, shell_stop
from bot.nodes.registry import NodeKind
from bot.settings import Settings

FAKE_EXEC = Path(__file__).with_name("fake_exec.py")
NO_CONTAINER = 125  # the fake exec's status for a container that does not run


class ContainerNodeSpec(NodeSpec):
    """A container, reached through its runtime's ``exec``: another machine as far as the
    bot is concerned (its own files; ``host``, its address, where its Ray listens)."""

    kind: Literal["container"]
    container: NonEmpty
    is_remote: ClassVar[bool] = True

    @property
    def identity(self) -> str:
        return f"container://{self.container}"

    @property
    def words(self) -> str:
        return f"container {self.container}"

    @property
    def label(self) -> str:
        return f"container {self.container}"


class ContainerNode:
    """The ``Node`` protocol over the fake ``exec`` program."""

    def __init__(self, root: Path, spec: ContainerNodeSpec) -> None:
        self.folder = root / spec.container
        self.name = spec.container
        self.spec = spec

    @property
    def where(self) -> str:
        return f"container {self.name}"

    @property
    def host(self) -> str:
        return self.spec.host or ""

    @property
    def python(self) -> str:
        return self.spec.python or "python3"

    @property
    def workdir(self) -> str:
        return self.spec.workdir or ""

    @property
    def ray_port(self) -> int | None:
        return self.spec.ray_port

    def _exec(self, command: str, stdin: bytes, timeout: float) -> tuple[int, bytes, bytes]:
        try:
            done = subprocess.run([sys.executable, str(FAKE_EXEC), str(self.folder), command],
                                  input=stdin, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise NodeUnreachable(f"{self.where}: no answer in {timeout:.0f} s") from exc
        if done.returncode == NO_CONTAINER:
            raise NodeUnreachable(f"{self.where}: {done.stderr.decode().strip()}")
        return done.returncode, done.stdout, done.stderr

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120.0,
            cap: int | None = None) -> tuple[int, str, str]:
        code, out, err = self._exec(command, stdin, timeout)
        limit = NODE_OUTPUT_CAP if cap is None else cap
        for stream, data in (("output", out), ("error", err)):
            if len(data) > limit:
                raise too_large(self.where, f"`{command[:80]}`", stream, limit)
        return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def send_archive(self, command: str, stream: bytes, timeout: float = 900.0) -> str:
        code, out, err = self.run(command, stream, timeout)
        if code != 0:
            raise DispatchError(f"{self.where}: the launcher ended with status {code}: "
                                f"{err.strip()[-500:]}")
        return out

    def read_file(self, path: str, offset: int = 0, size: int | None = None) -> bytes:
        read = ("import sys\ntry:\n    f = open(sys.argv[1], 'rb')\n"
                "except FileNotFoundError:\n    sys.exit(3)\n"
                "f.seek(int(sys.argv[2]))\nn = int(sys.argv[3])\n"
                "sys.stdout.buffer.write(f.read() if n < 0 else f.read(n))\n")
        code, out, err = self._exec(" ".join(shlex.quote(a) for a in (
            sys.executable, "-c", read, path, str(offset), str(-1 if size is None else size))),
            b"", 60)
        if code == 3:
            raise FileNotFoundError(path)
        if code != 0:
            raise DispatchError(f"{self.where}: cannot read {path}: {err.decode()[-300:]}")
        return out

    def probe(self, pid: int | None, run_dir: str) -> str:
        return shell_probe(self, pid, run_dir)

    def stop(self, pid: int | None, run_dir: str) -> None:
        shell_stop(self, pid, run_dir)


def container_kind(root: Path, ray_node: RayNodeOf = default_ray_node) -> NodeKind:
    """The kind, its containers' folders under ``root`` (``ray_node``: a several-node
    volume's Ray layout, the tests' free ports)."""
    def build(settings: Settings) -> NodeDispatcher:
        def node_of(spec: NodeSpec) -> ContainerNode:
            assert isinstance(spec, ContainerNodeSpec)
            return ContainerNode(root, spec)
        return NodeDispatcher(node_of, ray_node=ray_node,
                              keep_out=(settings.runs_dir, settings.db_path.parent))

    return NodeKind("container", ContainerNodeSpec, build)
