"""The pieces of the service-level several-node volume test: a project whose volume lists
two SSH nodes, the service composed as ``bot.compose.make_service`` composes it (with an
SSH dispatcher that trusts the two test sshd's and records what it sends), the Ray layout
of two nodes on one host, and what the handler executed, attempt by attempt."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot.dispatch.ray_cluster import RayNode
from bot.dispatch.upload import RUNNER_PACKAGE, SSHNode
from bot.manifest.project_check import precheck_manifest
from bot.messages.model import RecordingNotifier
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.policy import policy_for
from bot.service import PilotService
from bot.service.leases import lease_guard_for
from bot.settings import Settings
from bot.store import Store
from runner.events import Event
from tests.remote.remote_kit import free_port_layout
from tests.remote.sshd_server import Sshd

# Accepts every item (its category by parity), logs each id it ran to a file of its own
# process, and takes ``delay_s`` per item while the ``slow`` file exists: the test makes an
# attempt slow enough to be killed or stopped mid-run, and lets the last one run fast. Each
# item's output says which file it read, which module and runner package ran it, and its
# raylet's command line (which names the Ray temp dir of the node that started the worker).
HANDLER = '''
import os, time
import runner

def handle(items, ctx):
    p = ctx.params
    slow = os.path.exists(p["slow"])
    with open("/proc/%d/cmdline" % os.getppid(), "rb") as fh:
        raylet = fh.read().replace(b"\\0", b" ").decode()
    out = []
    for it in items:
        if slow:
            time.sleep(float(p["delay_s"]))
        with open(it.path, encoding="utf-8") as fh:
            text = fh.read()
        n = int(it.id.split("-")[1])
        files = os.path.join(ctx.outputs_dir, "files")  # written on the worker's own node
        os.makedirs(files, exist_ok=True)
        with open(os.path.join(files, it.id + ".bin"), "w", encoding="utf-8") as fh:
            fh.write(it.id)
        out.append({"id": it.id, "status": "accepted", "category": "odd" if n % 2 else "even",
                    "output": {"path": it.path, "text": text, "module": __file__,
                               "runner": runner.__file__, "raylet": raylet}})
    with open(os.path.join(p["log_dir"], "%d.log" % os.getpid()), "a") as fh:
        fh.write("".join(it.id + "\\n" for it in items))
    return out
'''


def write_project(root: Path, nodes: list[dict[str, Any]], count: int) -> tuple[Path, list[str]]:
    """A project with a 6-item pilot and a ``count``-item volume over ``nodes`` (the first
    is also the pilot's node); returns the manifest's path and the volume's ids."""
    ids = [f"item-{i:05d}" for i in range(count)]
    for folder, names in (("pilot", ids[:6]), ("corpus", ids)):
        (root / folder).mkdir(parents=True)
        for iid in names:
            (root / folder / f"{iid}.txt").write_text(iid, encoding="utf-8")
    (root / "volwork.py").write_text(HANDLER, encoding="utf-8")
    (root / "logs").mkdir()
    params = {"log_dir": str(root / "logs"), "slow": str(root / "slow"), "delay_s": 0.05}
    manifest = {
        "apiVersion": "preflight/v1", "name": "volume-e2e", "purpose": "inference",
        "hardware": {"gpu": "cpu", "lots": 1, "days": 3, "lot_price_usd_per_day": "0"},
        "backend": "cpu", "preparation": "pytorch", "node": nodes[0],
        "inputs": {"dir": "pilot", "pattern": "item-*.txt", "expected_count": 6},
        "task": {"kind": "classify", "handler": "volwork:handle", "batch_size": 8,
                 "categories": ["even", "odd"], "params": params},
        "success": {"min_accepted": 6, "max_refused": 0, "balance_ok": True},
        "approvals": {"approvers": ["alice"]},
        "volume": {"inputs": {"dir": "corpus", "pattern": "item-*.txt",
                              "expected_count": count}, "nodes": nodes, "batch_size": 16,
                   # the volume's path is tested here; the calibration has its own tests
                   # (tests/remote/test_remote_calibration.py): one Ray start less a pilot
                   "calibrate": False},
    }
    path = root / "manifest.yaml"
    path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return path, ids


class TwoNodesOneHost:
    """The dispatcher's ``ray_node``: both "nodes" are this host, so each start gets a
    free port layout (the second node's 100 higher) and temp dirs of its own. ``workdirs``:
    the two nodes' (they differ: each node runs from its own copy of the run)."""

    def __init__(self, workdirs: list[Path]) -> None:
        self.workdirs = workdirs
        self.temps: list[str] = []
        self.seen: set[int] = set()

    def __call__(self, index: int, node: SSHNode, run_id: str, gpus: bool) -> RayNode:
        if index == 0:
            self.ports = free_port_layout()
        self.temps.append(tempfile.mkdtemp(prefix="pv", dir="/tmp"))
        return RayNode(node.where, node.host, node.python, None if gpus else (),
                       self.ports.shifted(100 * index), self.temps[-1])

    def node_of(self, raylet: str) -> int:
        """Which node's raylet this command line is (it names that start's temp dir)."""
        return next(i % 2 for i, t in enumerate(self.temps) if t in raylet)

    def groups(self) -> set[int]:
        """The process groups every ``ray start`` seen so far ran in (each is kept in its
        temp dir until that node's Ray is stopped)."""
        self.seen |= {int(Path(t, "preflight.pgid").read_text()) for t in self.temps
                      if Path(t, "preflight.pgid").exists()}
        return set(self.seen)


class Recording(SSHDispatcher):
    """Keeps what each remote command was given, to show where the token went."""

    sent: list[tuple[str, str]]

    def run(self, node: SSHNode, command: str, stdin: str = "",
            timeout: float = 120, **kw: Any) -> tuple[int, str, str]:
        self.sent.append((command, stdin))
        return super().run(node, command, stdin, timeout, **kw)


def dispatcher_for(nodes: list[Sshd], layout: TwoNodesOneHost, known_hosts: Path) -> Recording:
    """An SSH dispatcher that trusts exactly these sshd's (their host keys, their user
    keys) and ships the real runner."""
    known_hosts.write_text("".join(n.known_hosts.read_text() for n in nodes))
    dispatcher = Recording(known_hosts=known_hosts, client_keys=[n.user_key for n in nodes],
                           use_agent=False, runner_package=RUNNER_PACKAGE,
                           backoff=(0.05, 0.5), ray_node=layout)
    dispatcher.sent = []
    return dispatcher


def compose(home: Path, dispatcher: SSHDispatcher) -> PilotService:
    """The service as ``bot.compose.make_service`` builds it (real SQLite store, the
    policy read from the settings, the lease guard, the manifest precheck), with this
    dispatcher for ``ssh`` nodes and a recording notifier standing in for Slack."""
    settings = Settings.from_env({"PREFLIGHT_HOME": str(home)})
    store = Store(settings.db_path)
    return PilotService(settings, store, {"ssh": dispatcher}, RecordingNotifier(),
                        lease_guard=lease_guard_for(store), policy=policy_for(settings),
                        precheck=precheck_manifest)


def stop_everything(service: PilotService, groups: Callable[[], set[int]]) -> None:
    """Whatever happened in a test: stop the runs that still run (a failed assertion must
    not leave a runner or Ray behind), SIGKILL every Ray process group ``groups()`` names
    (each node's ``ray start``), then close the SSH sessions and the store."""
    try:
        for run in service.store.list_runs(status="running"):
            try:
                service.stop(run["id"], by="test", reason="cleanup", timeout=60)
            except Exception:  # noqa: BLE001 - best effort; the groups below are killed
                pass
        for group in groups():
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        service.close()
        service.store.close()


def executed(root: Path) -> Counter[str]:
    """Every id the handler has run so far, anywhere, counted."""
    out: Counter[str] = Counter()
    for log in (root / "logs").glob("*.log"):
        out.update(log.read_text(encoding="utf-8").split())
    return out


def attempts(events: list[Event]) -> list[list[Event]]:
    """A run's recorded events split by runner attempt (each begins with run.started)."""
    out: list[list[Event]] = []
    for e in events:
        if e.type == "run.started" or not out:
            out.append([])
        out[-1].append(e)
    return out


def stage_facts(events: list[Event], stage: str) -> dict[str, Any] | None:
    passed = [e for e in events if e.type == "stage.passed" and e.data.get("stage") == stage]
    return dict(passed[-1].data.get("facts") or {}) if passed else None
