"""The volume's Ray cluster over the SSH connections the dispatcher already has.

Not Ray's cluster launcher: ``ray start --head`` on the first node and ``ray start
--address`` on the others, each with every port pinned (``RayPorts``), no dashboard, no
usage stats, and token authentication with a token made for the run. The token travels on
the command's standard input (never on a command line, in a file, a log, an event or
Slack). Each node offers only the healthy cards its card proof left
(``bot/dispatch/card_proof.py``: ``CUDA_VISIBLE_DEVICES`` and ``--num-gpus``), and its
workers run from its own copy of the run (``RayNode.package_root``, ``run_dir``). Before
anything starts, every node's Ray and Python versions are compared; a node without Ray is
refused with the command that installs the pinned version.
"""

from __future__ import annotations

import json
import secrets
import shlex
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Protocol

from bot.errors import DispatchError
from bot.node_programs import NODE_RAY
from runner.raypin import RAY_VERSION, install_command
from runner.spec import NODE_RUN_DIR_ENV, NODE_WHERE_ENV

# The node's Python and Ray versions, its cores, and which of the ports given as arguments
# are taken (a listening socket: another Ray, another volume node on the same host).
PROBE = ("import os, sys, json, socket\ntry:\n    import ray\n    v = ray.__version__\n"
         "except Exception:\n    v = None\nbusy = []\nfor p in sys.argv[1:]:\n"
         "    s = socket.socket()\n    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         "    try:\n        s.bind(('', int(p)))\n    except OSError:\n"
         "        busy.append(int(p))\n"
         "    finally:\n        s.close()\n"
         "print(json.dumps({'python': '%d.%d.%d' % sys.version_info[:3], "
         "'ray': v, 'cpus': os.cpu_count(), 'busy': busy}))")
# Worker ports a node needs beyond one per core: the driver, and the workers Ray starts
# besides the actors (I/O workers, a worker started ahead of the next actor).
WORKER_PORT_SPARE = 32
# How many worker nodes run ``ray start`` at the same time, once the head is up (each is
# one SSH command that waits on its node's raylet: ~2.5 s; one after another, 10 nodes
# took ~25 s of rented time). Like PREPARE_AT_ONCE in bot/nodes/ssh/dispatcher.py.
RAY_START_AT_ONCE = 8


@dataclass(frozen=True)
class RayPorts:
    """Every port a Ray node listens on; open these between the nodes (docs/volume.md)."""

    gcs: int = 6380
    node_manager: int = 6381
    object_manager: int = 6382
    runtime_env_agent: int = 6383
    dashboard_agent_grpc: int = 6384
    dashboard_agent_http: int = 6385
    metrics_export: int = 6386
    min_worker: int = 11000
    max_worker: int = 11063

    def shifted(self, by: int) -> RayPorts:
        """The same layout ``by`` higher (two nodes on one host: tests only)."""
        return RayPorts(**{k: v + by for k, v in self.__dict__.items()})

    def for_cores(self, cores: int) -> RayPorts:
        """The worker range wide enough for a node of ``cores`` CPUs: each Ray worker
        process (one per CPU worker of a CPU volume) takes a port of the range, and Ray
        refuses to start a worker once the range is used up. Never narrower than it was."""
        needed = max(0, int(cores)) + WORKER_PORT_SPARE
        if needed <= self.max_worker - self.min_worker + 1:
            return self
        return replace(self, max_worker=self.min_worker + needed - 1)

    def roles(self, head: bool) -> list[tuple[int, str]]:
        """(port, what it is for) of each port this node's Ray listens on (the GCS on the
        head only), its worker range included."""
        named = [(self.gcs, "GCS")] if head else []
        named += [(self.node_manager, "node manager"), (self.object_manager, "object manager"),
                  (self.runtime_env_agent, "runtime env agent"),
                  (self.dashboard_agent_grpc, "dashboard agent (gRPC)"),
                  (self.dashboard_agent_http, "dashboard agent (HTTP)"),
                  (self.metrics_export, "metrics export")]
        return named + [(p, "worker") for p in range(self.min_worker, self.max_worker + 1)]

    def overlaps(self, other: RayPorts) -> bool:
        """Any port of this layout is also one of ``other``'s (both as a head)."""
        return bool({p for p, _ in self.roles(True)} & {p for p, _ in other.roles(True)})

    def flags(self) -> list[str]:
        return ["--node-manager-port", str(self.node_manager),
                "--object-manager-port", str(self.object_manager),
                "--runtime-env-agent-port", str(self.runtime_env_agent),
                "--dashboard-agent-grpc-port", str(self.dashboard_agent_grpc),
                "--dashboard-agent-listen-port", str(self.dashboard_agent_http),
                "--metrics-export-port", str(self.metrics_export),
                "--min-worker-port", str(self.min_worker),
                "--max-worker-port", str(self.max_worker)]


@dataclass(frozen=True)
class RayNode:
    """One node of the cluster: where to reach it, its interpreter, its healthy cards."""

    where: str  # user@host:port, for messages
    address: str  # the address the other nodes reach it at
    python: str = "python3"
    cards: tuple[int, ...] | None = None  # None: every card it sees; (): a CPU node
    ports: RayPorts = field(default_factory=RayPorts)
    temp_dir: str = "/tmp/ray"
    # The node's own copy of the run (bot/dispatch/card_proof.py, NodeCopy): its runner
    # package goes on the PYTHONPATH of its Ray, whose workers inherit it with the run
    # directory (NODE_RUN_DIR_ENV), where they find the node's own spec, project and inputs.
    package_root: str = ""
    run_dir: str = ""


class Shell(Protocol):
    """Runs a command on a node (the SSH dispatcher's connection), ``stdin`` fed to it."""

    def __call__(self, node: RayNode, command: str, stdin: str = "") -> tuple[int, str, str]:
        ...


def probe_command(python: str, ports: Sequence[int] = ()) -> str:
    return " ".join([shlex.quote(python), "-c", shlex.quote(PROBE), *map(str, ports)])


def check_apart(nodes: Sequence[RayNode]) -> None:
    """Refuse two nodes on one host whose Ray ports overlap (a worker range widened for a
    node's cores can reach the next layout): Ray would fail on the port they share."""
    for i, node in enumerate(nodes):
        for other in nodes[:i]:
            if other.address == node.address and other.ports.overlaps(node.ports):
                raise DispatchError(
                    f"{node.where}: its Ray ports ({node.ports.gcs}-"
                    f"{node.ports.metrics_export}, workers {node.ports.min_worker}-"
                    f"{node.ports.max_worker}) overlap those of {other.where} on the same "
                    f"host {node.address}: set its volume.nodes[].ray_port further apart")


def check_ports(nodes: Sequence[RayNode], outputs: Sequence[str]) -> None:
    """Refuse, naming the node, the port and what it is for, a node whose Ray ports are
    taken (Ray itself would only say "GCS has become overloaded")."""
    for i, (node, out) in enumerate(zip(nodes, outputs)):
        try:
            busy = set(json.loads(out.strip().splitlines()[-1]).get("busy") or [])
        except (ValueError, IndexError, AttributeError):
            continue  # check_versions has named an unreadable answer already
        taken = [(p, role) for p, role in node.ports.roles(i == 0) if p in busy]
        if taken:
            named = ", ".join(f"{p} ({role})" for p, role in taken[:5])
            more = f" and {len(taken) - 5} more" if len(taken) > 5 else ""
            raise DispatchError(
                f"{node.where}: port {named}{more} already in use on {node.address}: "
                "another Ray, or another volume node on the same host; set this node's "
                "volume.nodes[].ray_port to a free range (its Ray needs "
                f"{node.ports.gcs}-{node.ports.metrics_export} and workers "
                f"{node.ports.min_worker}-{node.ports.max_worker}), or stop what holds it")


def check_versions(nodes: Sequence[RayNode], outputs: Sequence[str]) -> list[RayNode]:
    """Refuse, in one message, a node without Ray or whose Ray or Python differs; returns
    the nodes with their worker port range sized for their cores (``RayPorts.for_cores``).

    Ray refuses to join nodes of different versions, even a patch apart; the head (the
    first node) must run the pinned version.
    """
    found, sized = [], []
    for node, out in zip(nodes, outputs):
        try:
            facts = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise DispatchError(f"{node.where}: cannot read its Ray and Python versions "
                                f"(`{node.python}` printed {out[-200:]!r})") from exc
        if not isinstance(facts, dict) or not isinstance(facts.get("python"), str) \
                or not isinstance(facts.get("ray"), (str, type(None))):
            raise DispatchError(f"{node.where}: its Ray and Python versions are not the "
                                f"probe's answer (`{node.python}` printed {out[-200:]!r})")
        if not facts.get("ray"):
            raise DispatchError(f"{node.where}: Ray is not installed for {node.python}; "
                                f"install the pinned version: {install_command(node.python)}")
        found.append((node, str(facts["ray"]), str(facts["python"])))
        cores = facts.get("cpus")
        sized.append(replace(node, ports=node.ports.for_cores(cores))
                     if isinstance(cores, int) else node)
    head, head_ray, head_py = found[0]
    if head_ray != RAY_VERSION:
        raise DispatchError(f"{head.where}: Ray {head_ray}, but the volume needs Ray "
                            f"{RAY_VERSION}: {install_command(head.python)}")
    for node, ray, py in found[1:]:
        if ray != head_ray:
            raise DispatchError(f"{node.where}: Ray {ray}, but the head {head.where} has Ray "
                                f"{head_ray}: every node needs the same version "
                                f"({install_command(node.python)})")
        if py.split(".")[:2] != head_py.split(".")[:2]:
            raise DispatchError(f"{node.where}: Python {py}, but the head {head.where} has "
                                f"Python {head_py}: Ray needs the same Python on every node")
    return sized


# The run's Ray temp dir on the node (its sockets, logs and ``preflight.pgid``) is made
# private by ``ray_hold.py`` (sent as its text, ``NODE_RAY``), which starts and stops this
# run's Ray in a process group of its own. Ray itself gets a folder inside it
# (``RAY_SUBDIR``), since Ray makes its temp dir 0777 on purpose; the private folder around
# it keeps other users out. (Keep the path short: Ray's AF_UNIX sockets live under it, and
# a socket path must stay under 108 characters.)
RAY_SUBDIR = "ray"


def start_command(node: RayNode, head: str | None) -> str:
    """``ray start`` for one node (``head`` None: this is the head), in a process group of
    its own. The token is read from standard input so no command line or file holds it."""
    env = ["RAY_AUTH_MODE=token", "RAY_USAGE_STATS_ENABLED=0"]
    gpus: list[str] = []
    if node.cards is not None:  # None: Ray counts the cards the node sees
        env.append(f"CUDA_VISIBLE_DEVICES={','.join(str(c) for c in node.cards)}")
        gpus = ["--num-gpus", str(len(node.cards))]
    if node.package_root:
        env.append(f"PYTHONPATH={shlex.quote(node.package_root)}${{PYTHONPATH:+:$PYTHONPATH}}")
    if node.run_dir:
        env.append(f"{NODE_RUN_DIR_ENV}={shlex.quote(node.run_dir)}")
    env.append(f"{NODE_WHERE_ENV}={shlex.quote(node.where)}")  # the workers' name of it
    args = [node.python, "-c", NODE_RAY, "start", node.temp_dir, "-m", "ray.scripts.scripts",
            "start", "--disable-usage-stats", "--node-ip-address", node.address,
            *gpus, "--temp-dir", f"{node.temp_dir}/{RAY_SUBDIR}", *node.ports.flags()]
    if head is None:
        args += ["--head", "--port", str(node.ports.gcs), "--include-dashboard=false"]
    else:
        args += ["--address", head]
    return ("IFS= read -r RAY_AUTH_TOKEN && export RAY_AUTH_TOKEN " + " ".join(env)
            + " && exec " + " ".join(shlex.quote(a) for a in args))


def stop_command(node: RayNode) -> str:
    """End this run's Ray on the node: its process group (SIGTERM, then SIGKILL)."""
    return " ".join(shlex.quote(a) for a in (node.python, "-c", NODE_RAY, "stop",
                                              node.temp_dir))


@dataclass
class RayCluster:
    """A started cluster: its head's address and the token the driver needs."""

    nodes: list[RayNode]
    token: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)

    @property
    def address(self) -> str:
        head = self.nodes[0]
        return f"{head.address}:{head.ports.gcs}"

    def driver_env(self) -> dict[str, str]:
        """What the driver's environment needs to join (hand it over, never write it)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                "RAY_USAGE_STATS_ENABLED": "0"}


def start_cluster(shell: Shell, nodes: Sequence[RayNode],
                  started: Callable[[int, RayNode], None] | None = None) -> RayCluster:
    """Compare versions (every node probed at once), then start the head and then the
    other nodes, up to
    ``RAY_START_AT_ONCE`` of them at a time; stop all on failure (the first failing node
    by node order is named). ``started`` hears of each node whose Ray is up, one at a
    time, in the order they come up (it may raise: all are stopped)."""
    if not nodes:
        raise DispatchError("a volume needs at least one node")
    def probe(node: RayNode) -> str:
        head = node is nodes[0]
        code, out, err = shell(node, probe_command(node.python,
                                                   [p for p, _ in node.ports.roles(head)]))
        if code != 0:
            raise DispatchError(f"{node.where}: `{node.python}` cannot run: {err[-300:]}")
        return out

    with ThreadPoolExecutor(max_workers=min(RAY_START_AT_ONCE, len(nodes))) as pool:
        probes = [pool.submit(probe, node) for node in nodes]  # every node's at once
        wait(probes)
    answers = [p.result() for p in probes]
    nodes = check_versions(nodes, answers)  # the first by node order
    check_ports(nodes, answers)
    check_apart(nodes)
    cluster = RayCluster(list(nodes))

    def start(i: int) -> None:
        node = nodes[i]
        code, out, err = shell(node, start_command(node, None if i == 0 else cluster.address),
                               cluster.token + "\n")
        if code != 0:
            raise DispatchError(f"{node.where}: ray start failed (exit {code}): "
                                f"{_tail(err or out)}")
        if started is not None:
            with heard:
                started(i, node)

    heard = threading.Lock()  # ``started`` hears one node at a time
    try:
        start(0)  # the head first: the others join it
        if len(nodes) > 1:
            with ThreadPoolExecutor(max_workers=min(RAY_START_AT_ONCE, len(nodes) - 1)) as pool:
                futures = [pool.submit(start, i) for i in range(1, len(nodes))]
                wait(futures)
            for future in futures:  # the first failure by node order is the one named
                future.result()
    except BaseException:
        stop_cluster(shell, nodes)
        raise
    return cluster


def stop_cluster(shell: Shell, nodes: Sequence[RayNode]) -> list[str]:
    """End this run's Ray on every node, the head last; returns the problems met."""
    problems = []
    for node in reversed(list(nodes)):
        try:
            code, _out, err = shell(node, stop_command(node))
        except DispatchError as exc:
            problems.append(str(exc))
            continue
        if code != 0:
            problems.append(f"{node.where}: stopping Ray failed (exit {code}): {_tail(err)}")
    return problems


def with_cards(node: RayNode, cards: Sequence[int] | None) -> RayNode:
    return replace(node, cards=tuple(cards) if cards is not None else None)


def _tail(text: str) -> str:
    return " | ".join(ln for ln in str(text).strip().splitlines()[-3:])[-400:]


