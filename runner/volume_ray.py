"""Ray for the volume: joining or starting the cluster, the worker actor, leftovers.

Imported only by the volume's driver; ``ray`` itself is imported inside the functions
(the runner's core stays standard library). No Ray retries anywhere: actors have
``max_restarts=0`` and ``max_task_retries=0``; the driver re-queues what a lost worker held.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Tuple, Type

from runner.raypin import RAY_VERSION, install_command
from runner.spec import NODE_RUN_DIR_ENV, NODE_WHERE_ENV
from runner.stage import StageFailure

SESSION_FILE = "ray_session.json"


def prepare_env(vspec: Any) -> None:
    """Ray reads these when it is imported: usage stats off; a local Ray gets token
    authentication with a token made here for this run (never written down). Joining a
    cluster, the dispatcher hands the driver the cluster's token in its environment."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    if not vspec.address:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def import_ray(stage: str = "pilot") -> Any:
    """The ``ray`` module, or a stage failure saying how to install the pinned version.

    Call :func:`prepare_env` first: Ray reads its settings at import."""
    try:
        import ray
    except ImportError as exc:
        raise StageFailure(stage, f"cannot import ray: {exc}",
                           hint=f"install the pinned Ray on every node: "
                                f"{install_command(sys.executable)}") from exc
    return ray


def start(ray: Any, vspec: Any, run_dir: str, cpu_workers: int,
          stage: str = "pilot") -> Dict[str, Any]:
    """Join ``vspec.address`` or start a local Ray; record its session for cleanup.

    A local Ray has no dashboard. Returns facts (version, address, session).
    """
    quiet = {"logging_level": "WARNING", "log_to_driver": False, "configure_logging": True}
    if vspec.address:
        _join(ray, vspec.address, quiet, stage=stage)
    else:
        gpus = len(vspec.cards) if vspec.gpus and vspec.cards is not None else None
        if vspec.gpus and vspec.cards is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(c) for c in vspec.cards)
        # address "local": a Ray of our own, never another one found running on the node
        ray.init(address="local", num_cpus=max(1, cpu_workers), num_gpus=gpus if vspec.gpus else 0,
                 include_dashboard=False, **quiet)
    session = _session_dir(ray)
    if session and not vspec.address:
        _write_json(os.path.join(run_dir, SESSION_FILE), {
            "session_dir": session, "driver_pid": os.getpid(), "pgid": os.getpgid(0)})
    return {"ray_version": ray.__version__, "ray_pinned": RAY_VERSION,
            "address": vspec.address or "local", "session": os.path.basename(session or "")}


def _join(ray: Any, address: str, options: Dict[str, Any], tries: int = 3,
          stage: str = "pilot") -> None:
    """Join the cluster; a busy head may miss one connection deadline, so try again."""
    for attempt in range(1, tries + 1):
        try:
            ray.init(address=address, **options)
            return
        except ConnectionError as exc:
            if attempt == tries:
                raise StageFailure(stage, f"cannot join the Ray cluster at {address} "
                                   f"after {tries} tries: {exc}",
                                   hint="check the head node is up and its GCS port open "
                                        "(docs/volume.md, ports)") from exc
            ray.shutdown()
            time.sleep(2.0 * attempt)


def _session_dir(ray: Any) -> Optional[str]:
    node = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(getattr(node, "global_worker", None), "node", None)
    path = getattr(node, "get_session_dir_path", None)
    return str(path()) if callable(path) else None


def stop(ray: Any, actors: List[Any], run_dir: str) -> None:
    """Kill our actors, leave Ray, and end what a local Ray of this run left behind."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead, or the cluster is gone
            pass
    try:
        ray.shutdown()
    finally:
        clean_local_session(run_dir)


def clean_local_session(run_dir: str, grace_s: float = 3.0) -> List[int]:
    """End every process of the local Ray session this run recorded; returns their pids.

    A driver killed with SIGKILL takes its GCS and raylet along but leaves Ray's agents
    behind; resume and the end of a run call this so nothing of ours stays running.
    """
    path = os.path.join(run_dir, SESSION_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
        session = str(record.get("session_dir") or "")
        pgid = record.get("pgid")
    except (OSError, ValueError, AttributeError):
        return []
    pids = session_pids(session, pgid if isinstance(pgid, int) else None) if session else []
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    _signal_all([p for p in pids if _alive(p)], signal.SIGKILL)
    try:
        os.remove(path)
    except OSError:
        pass
    return pids


def session_pids(session_dir: str, pgid: Optional[int] = None) -> List[int]:
    """Live processes of this user that belong to a local Ray session: their command line
    names the session directory, or (Ray's agents rename themselves ``ray::...``) they are
    Ray processes in the process group of the driver that started the session."""
    needle = session_dir.encode()
    found: List[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != os.getuid():
                continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read()
            if needle in cmd or (pgid is not None and _ray_program(cmd)
                                 and _pgid(int(name)) == pgid):
                if _alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _ray_program(cmdline: bytes) -> bool:
    """A process of Ray's own: an agent renamed ``ray::...``, or a program of the ``ray``
    package. Not any command line that holds "ray" somewhere: a process sharing the driver's
    group whose arguments named Ray's folder on ``sys.path`` (a test's all-reduce rank) was
    sent SIGTERM."""
    if cmdline.startswith(b"ray::"):
        return True
    return any(b"/ray/" in arg for arg in cmdline.split(b"\0")[:2])


def _pgid(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().split(b") ", 1)[-1][:1] not in (b"Z", b"X")
    except OSError:
        return False


def _signal_all(pids: List[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _write_json(path: str, data: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


class _Worker:
    """One Ray actor: the handler loaded once, then called batch after batch.

    Defined at module level but made remote by :func:`worker_class`, so importing this
    module never imports Ray. Errors come back as values, never as Ray retries.
    """

    def __init__(self, spec: Dict[str, Any], outputs_dir: str, sys_path: List[str],
                 device: str, shard_prefix: str = "w") -> None:
        self.error: Optional[str] = None
        self.handler: Any = None
        self.threads: Dict[str, Any] = {}
        self.inputs_root = ""
        self.project_dir: Optional[str] = None
        self.clock: Any = None
        from runner.readahead import ReadAhead

        self.readahead = ReadAhead()
        self.node_run_dir = os.environ.get(NODE_RUN_DIR_ENV) or None
        if self.node_run_dir is None:  # one machine: the driver's paths are this node's
            for entry in reversed(sys_path):
                if entry not in sys.path:
                    sys.path.insert(0, entry)
        try:
            from runner.spec import RunSpec
            from runner.workloads import load_handler, make_context

            if self.node_run_dir is not None:
                spec, outputs_dir = node_paths(spec, self.node_run_dir)
            run_spec = RunSpec.from_dict(spec)
            self.inputs_root = os.path.abspath(run_spec.inputs.dir)
            self.project_dir = run_spec.project.dir
            self.handler = load_handler(run_spec)
            self.ctx = make_context(run_spec, outputs_dir)
            self.ctx.device = device
            from runner.outputs import ShardWriter  # issue 34: outputs written here, per batch

            self.shards = ShardWriter(os.path.dirname(os.path.abspath(outputs_dir)), shard_prefix)
            self.threads = actor_threads(spec)
            from runner.itemtimeout import ItemClock, item_timeout, pilot_item_s

            self.clock = ItemClock(item_timeout(run_spec), pilot_item_s(run_spec))
        except Exception as exc:  # reported by where(), the driver's first call
            self.error = f"{type(exc).__name__}: {exc}"

    def where(self) -> Dict[str, Any]:
        import socket

        import ray

        ctx = ray.get_runtime_context()
        return {"node": ctx.get_node_id(), "host": socket.gethostname(), "pid": os.getpid(),
                "where": os.environ.get(NODE_WHERE_ENV) or None,
                "cards": [str(c) for c in ray.get_gpu_ids()], "error": self.error,
                "threads": self.threads,
                "item_timeout": "on" if self.clock is not None and self.clock.active
                else f"off: {self.clock.why_off if self.clock is not None else 'not loaded'}",
                "run_dir": self.node_run_dir}

    def outputs_listing(self) -> Dict[str, Any]:
        """This node's ``outputs/`` as ``runner.volume_outputs.node_listing`` sees it (a
        several-node volume: its own copy of the run; one machine: nothing)."""
        import socket

        from runner.volume_outputs import node_listing

        listing = node_listing(self.node_run_dir)
        listing["where"] = f"{socket.gethostname()}:{self.node_run_dir}"
        return listing

    def outputs_chunk(self, rel: str, offset: int, size: int) -> bytes:
        from runner.volume_outputs import read_chunk

        return read_chunk(self.node_run_dir, rel, offset, size)

    def run(self, batch: List[List[Any]],
            ahead: Optional[List[List[List[Any]]]] = None) -> Dict[str, Any]:
        """``batch`` under the item clock; ``ahead``: the batches this worker runs next
        (``volume.prefetch``), whose files are read while the handler computes."""
        items = self.readahead.items(batch, self.inputs_root)  # runner/readahead.py
        self.readahead.start(ahead, self.inputs_root)
        from runner.handler_call import BatchCall
        from runner.itemtimeout import ItemTimedOut
        from runner.outputs import OutputsError

        t0 = time.perf_counter()
        call = BatchCall(self.handler, items, self.ctx)  # keeps what a failure leaves
        try:
            with self.clock:  # task.item_timeout_s per item, as in the pilot
                results = self.clock.call(call, len(items))
            # the batch's outputs durable in one shard on this node before the driver hears
            results = self.shards.write(results)
            return {"results": results, "seconds": time.perf_counter() - t0,
                    "shards": self.shards.drain()}
        except OutputsError as exc:  # this node's disk, not the handler
            return {"error": str(exc), "cause": "raised", "seconds": time.perf_counter() - t0}
        except ItemTimedOut:
            return {"error": f"no result within task.item_timeout_s = "
                             f"{self.clock.per_item_s:g} s per item", "cause": "timeout",
                    "seconds": time.perf_counter() - t0, **self._partial(call)}
        except Exception as exc:  # its place kept: runner/handler_errors.py
            from runner.handler_errors import formatted, where

            at = where(exc, self.project_dir)
            return {"error": f"task.handler raised {type(exc).__name__}: {exc}"
                             + (f" (at {at})" if at else ""), "cause": "raised",
                    "where": at, "traceback": formatted(exc), **self._partial(call)}

    def _partial(self, call: Any) -> Dict[str, Any]:
        """What a failed call leaves (``runner/handler_call.py``), the outputs of the
        results it yielded made durable in a shard first, as a batch's are; a shard that
        cannot be written leaves those inputs to run again."""
        from runner.outputs import OutputsError

        left: Dict[str, Any] = call.partial()
        if "results" in left:
            try:
                left["results"] = self.shards.write(left["results"])
                left["shards"] = self.shards.drain()
            except OutputsError:
                del left["results"]
        return left


def node_paths(spec: Dict[str, Any], run_dir: str) -> Tuple[Dict[str, Any], str]:
    """The driver's spec with this node's own project and inputs (the spec.json the
    dispatcher uploaded into this node's run directory), and this node's outputs dir."""
    path = os.path.join(run_dir, "spec.json")
    try:
        with open(path, encoding="utf-8") as fh:
            node = json.load(fh)
        project, inputs_dir = node["project"], node["inputs"]["dir"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"this node's copy of the run ({path}) is unreadable: "
                           f"{type(exc).__name__}: {exc}") from exc
    spec = {**spec, "project": project, "inputs": {**spec["inputs"], "dir": inputs_dir}}
    return spec, os.path.join(run_dir, "outputs")


def actor_threads(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Torch's threads in this actor: ``task.torch_threads``, else the CPUs Ray gave it (a
    CPU worker), else its node's cores shared by the workers its cards allow (a GPU worker
    reserves no CPU). Set through torch when the handler imported it, and through
    ``OMP_NUM_THREADS`` for a torch imported later."""
    import ray as ray_module

    from runner.threads import owned_cores, set_torch_threads

    ray: Any = ray_module  # Ray's API is untyped
    ctx = ray.get_runtime_context()
    cpus = int(float(ctx.get_assigned_resources().get("CPU") or 0))
    if cpus >= 1:
        owned = (cpus, f"{cpus} CPU(s) Ray gave this worker")
    else:
        per = int((spec.get("volume") or {}).get("cards_per_worker") or 1)
        here = [n.get("Resources", {}).get("GPU", 0) for n in ray.nodes()
                if n.get("NodeID") == ctx.get_node_id()]
        owned = owned_cores(max(1, int(here[0] if here else 1) // per))
    return set_torch_threads((spec.get("task") or {}).get("torch_threads"), owned=owned,
                             import_torch=False)


def worker_class(ray: Any, cards_per_worker: int, gpus: bool) -> Any:
    """The remote actor class: no restarts, no task retries, cards only when asked."""
    options: Dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0}
    if gpus:
        options.update(num_gpus=cards_per_worker, num_cpus=0)
    else:
        options.update(num_cpus=1)
    return ray.remote(**options)(_Worker)


def lost_errors(ray: Any) -> Tuple[Type[BaseException], ...]:
    """The Ray exceptions that mean a worker (or its node) is gone."""
    exc = ray.exceptions
    names = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
             "NodeDiedError", "ObjectLostError", "OwnerDiedError", "ActorUnschedulableError")
    found = [getattr(exc, n, None) for n in names]
    return tuple(t for t in found if isinstance(t, type) and issubclass(t, BaseException))
