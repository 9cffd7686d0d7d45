"""Building a service wired to the SSH dispatcher, over a small project, for the tests."""

from __future__ import annotations

import json
import random
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.dispatch.ray_cluster import RayPorts
from bot.dispatch.upload import RUNNER_PACKAGE
from bot.manifest.load import LoadedManifest, load_manifest, load_manifest_file
from bot.manifest.nodes import NodeSpec
from bot.messages.model import RecordingNotifier
from bot.node_programs import NODE_RAY
from bot.nodes.ssh.adapter import SSHAdapter
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.service import PilotService
from bot.service.leases import lease_guard_for, set_state
from bot.settings import Settings
from bot.store import Store
from runner.events import Event, read_events
from tests.events_check import assert_recorded_whole
from tests.remote.sshd_server import Sshd

REPO = Path(__file__).resolve().parents[2]


def write_project(root: Path, node: dict[str, Any], *, count: int = 4,
                  gate_after: int | None = None, name: str = "remote-demo",
                  copy_to: str | None = None, die_after: int | None = None) -> Path:
    """A project with ``count`` documents and a manifest whose node is ``node``."""
    docs = root / "data" / "pilote"
    docs.mkdir(parents=True, exist_ok=True)
    for n in range(1, count + 1):
        (docs / f"doc-{n:02d}.txt").write_text(f"invoice number {n} total due", encoding="utf-8")
    (root / "src").mkdir(exist_ok=True)
    (root / "src" / "app.py").write_text("VALUE = 1\n")
    params = {"gate_after": gate_after} if gate_after is not None else {}
    if die_after is not None:
        params["die_after"] = die_after
    manifest = {
        "apiVersion": "preflight/v1", "name": name, "purpose": "inference",
        "hardware": {"gpu": "cpu", "lots": 1, "days": 3, "lot_price_usd_per_day": "0"},
        "backend": "cpu", "preparation": "pytorch", "node": node,
        "inputs": {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": count,
                   "expected_refusals": []},
        "task": {"kind": "classify", "handler": "runner.workloads.classify:handle",
                 "categories": ["invoice", "contract"], "params": params},
        "success": {"min_accepted": count, "max_refused": 0, "balance_ok": True},
        "approvals": {"approvers": ["alice"]},
    }
    if copy_to:
        manifest["results"] = {"copy_to": copy_to}
    path = root / "manifest.yaml"
    path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return path


@dataclass
class Bot:
    """One "bot process": its store, service, notifier and SSH dispatcher."""

    settings: Settings
    store: Store
    service: PilotService
    notifier: RecordingNotifier
    dispatcher: SSHDispatcher

    def close(self) -> None:
        self.dispatcher.close()
        self.store.close()


def make_bot(home: Path, dispatcher: SSHDispatcher, *, guard: bool = True) -> Bot:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(home)})
    store = Store(settings.db_path)
    notifier = RecordingNotifier()
    service = PilotService(settings, store, {"ssh": dispatcher}, notifier,
                           lease_guard=lease_guard_for(store) if guard else None)
    return Bot(settings, store, service, notifier, dispatcher)


def provision(store: Store, node: str) -> None:
    """Record the lease of ``node`` (its key, ``host:port``) up to ``provisioned``."""
    for state in ("ordered", "payment-notified", "funds-confirmed", "provisioned"):
        set_state(store, node, state, "alice")


@contextmanager
def provisioned_bot(home: Path, sshd: Sshd,
                    dispatcher: SSHDispatcher | None = None) -> Iterator[Bot]:
    """A bot over ``dispatcher`` (by default one that trusts only ``sshd``) whose lease of
    ``sshd``'s node is provisioned; closed when the block ends."""
    bot = make_bot(home, dispatcher if dispatcher is not None else sshd.dispatcher())
    try:
        provision(bot.store, sshd.lease_key)
        yield bot
    finally:
        bot.close()


def submit(bot: Bot, manifest: Path | LoadedManifest, *, submitter: str = "bob") -> str:
    """Submit ``manifest`` (a file, or one loaded already): the run's id."""
    loaded = manifest if isinstance(manifest, LoadedManifest) else load_manifest_file(manifest)
    return bot.service.submit(loaded, submitter=submitter).run_id


def start_run(bot: Bot, manifest: Path | LoadedManifest, *, submitter: str = "bob") -> str:
    """Submit ``manifest`` and dispatch it to its node: the run's id."""
    run_id = submit(bot, manifest, submitter=submitter)
    bot.service.starter.start(run_id)
    return run_id


@contextmanager
def pilote_bot(tmp_path: Path, sshd: Sshd, python: str = sys.executable,
               dispatcher: SSHDispatcher | None = None) -> Iterator[tuple[Bot, LoadedManifest]]:
    """A provisioned bot (home ``tmp_path/home``) whose dispatcher (by default ``sshd``'s)
    sends the real runner, and manifests/pilote.yaml run by ``python`` on ``sshd``'s node
    (workdir ``tmp_path/node``), its evidence copied to ``tmp_path/evidence``."""
    pilote = _pilote_over_ssh(sshd, tmp_path / "node", tmp_path / "evidence", python)
    if dispatcher is None:
        dispatcher = sshd.dispatcher(runner_package=RUNNER_PACKAGE)
    with provisioned_bot(tmp_path / "home", sshd, dispatcher) as bot:
        yield bot, pilote


def _pilote_over_ssh(sshd: Sshd, workdir: Path, evidence: Path, python: str) -> LoadedManifest:
    """manifests/pilote.yaml with its node turned into this sshd and a local evidence copy."""
    text = (REPO / "manifests" / "pilote.yaml").read_text(encoding="utf-8")
    node = (f"node:\n  kind: ssh\n  host: 127.0.0.1\n  port: {sshd.port}\n  user: {sshd.user}\n"
            f"  workdir: {workdir}\n  python: {python}\n")
    assert "node:\n  kind: local\n" in text and "copy_to: evidence/pilote-demo" in text
    text = (text.replace("node:\n  kind: local\n", node)
            .replace("copy_to: evidence/pilote-demo", f"copy_to: {evidence}"))
    return load_manifest(text, source="pilote-ssh.yaml", base_dir=REPO / "manifests")


def items_done(n: int) -> Callable[[list[Event]], bool]:
    """A ``pump_until`` predicate: ``n`` items done at least."""
    return lambda events: sum(e.type == "item.done" for e in events) >= n


def wait_for(condition: Callable[[], Any], *, timeout: float = 30, what: str = "condition") -> Any:
    """Poll ``condition`` until it is truthy, with a deadline (never a bare sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def pump_until(bot: Bot, run_id: str, predicate: Callable[[list[Event]], bool], *,
               timeout: float = 30) -> list[Event]:
    """Pump the run until the recorded events satisfy ``predicate``."""
    def step() -> bool:
        bot.service.follower.pump(run_id)
        return predicate(bot.store.events(run_id))

    wait_for(step, timeout=timeout, what=f"events of {run_id}")
    return bot.store.events(run_id)


def remote_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events the node's runner wrote, its item batches expanded (one per seq)."""
    return [e.to_dict() for e in read_events(str(run_dir / "events.jsonl"))[0]]


def assert_exactly_once(bot: Bot, run_id: str, remote_run: Path) -> None:
    """The bot recorded each event the node wrote once, in seq order, and each item once."""
    assert_recorded_whole(bot.store, run_id, read_events(str(remote_run / "events.jsonl"))[0])
    ids = [i["id"] for i in bot.store.items(run_id)]
    assert len(ids) == len(set(ids))


def free_port_layout(nodes: int = 2) -> RayPorts:
    """A Ray port layout whose every port is free now, for ``nodes`` layouts 100 apart."""
    for _ in range(50):
        base = RayPorts().shifted(random.randrange(1000, 20000))
        ports = [p for i in range(nodes) for k, p in base.shifted(100 * i).__dict__.items()
                 if k not in ("min_worker", "max_worker")]
        if all(_port_free(p) for p in ports):
            return base
    raise AssertionError("no free port layout")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def command_kind(command: str) -> str:
    """What a volume's dispatch asks a node (for the fakes that answer without SSH): its
    card proof, ``ray start``, the stop of its Ray, else the version probe."""
    if "--stages" in command:
        return "proof"
    argv = shlex.split(command.split(" && exec ", 1)[-1])  # a start reads its token first
    if len(argv) > 3 and argv[1:3] == ["-c", NODE_RAY] and argv[3] in ("start", "stop"):
        return argv[3]
    return "probe"


def nodes_through(runs: Any) -> Callable[[NodeSpec], SSHAdapter]:
    """The ``node_of`` of a volume's steps for a fake of the sessions' ``run`` (a
    ``run(node, command, stdin, timeout)`` that answers without SSH): each node section's
    SSH node, its commands through ``runs``."""
    return lambda spec: SSHAdapter.of(runs, spec)
