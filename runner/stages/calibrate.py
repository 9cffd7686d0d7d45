"""The ``calibrate`` stage: the volume's work measured on a sample of its own inputs.

After a passing pilot (its items, its balance) and before the approval is offered, the
pilot's node runs a random sample of the **volume's** inputs the way the volume will run
them: a local Ray, the workers this node would start (one per healthy card, or one per core
up to 4 on a CPU node), each loading the handler and making **one warm-up call** that is
timed apart, then at least ``calibration.batches`` batches at the **volume's batch size**,
timed one by one on their worker. Their results are recorded as they come back (as the
driver does, the workers still running) into a scratch ledger and a scratch events file
under ``calibration/`` of the run directory, timed (the driver's recording rate on this
disk), and never into the run's ledger: the volume runs those inputs again. The facts (the
sample's ids, each batch's items, bytes and seconds, Ray's start and stop, each worker's
warm-up, the recording rate, the outputs' files and bytes) are what the bot's forecast
reads (bot/pilot/calibration.py). docs/forecast.md.

A corpus the node does not hold (an SSH pilot whose volume's inputs are on the bot host)
is sampled by the bot with the same seed and sent with the pilot
(bot/dispatch/calibration_sample.py): ``dir`` then holds that sample, and the spec says how
many inputs it was drawn from (``listed``). A volume corpus this node cannot list, or a Ray
it cannot import, skips the stage with the reason (the forecast then rests on the pilot
alone and says so). Standard library only at import time.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from runner.inputs import InputsError, Item, list_dir
from runner.spec import CalibrationSpec, VolumeSpec, draw_sample, healthy_cards
from runner.stage import StageContext, StageFailure, StageSkipped

CALIBRATION_DIR = "calibration"
CPU_WORKERS_MAX = 4        # as runner/volume_workers.py: a local Ray's CPU workers
PACE_PROBE_S = 0.05        # batches faster than this (wall, through one driver): the driver
PACE_BATCHES = 60          # may bound the volume: this many go through the volume's Driver
WAIT_S = 600.0             # a worker's warm-up or batch answers within this


def calibrate(ctx: StageContext) -> Dict[str, Any]:
    """Run the calibration of ``ctx.spec.calibration``; returns its facts."""
    cal = ctx.spec.calibration
    if cal is None:
        raise StageSkipped("no volume to calibrate")
    began = time.perf_counter()  # what the volume's driver does from its stage's start:
    files = _listing(cal)        # list the inputs, start Ray, load every worker's handler
    size = max(1, int(cal.batch_size))
    from runner import volume_ray

    vspec = VolumeSpec(cards_per_worker=max(1, cal.cards_per_worker), batch_size=size,
                       gpus=cal.gpus, cards=healthy_cards(ctx.facts) if cal.gpus else None)
    volume_ray.clean_local_session(ctx.run_dir)
    volume_ray.prepare_env(vspec)
    try:
        ray = volume_ray.import_ray("calibrate")
    except StageFailure as exc:
        raise StageSkipped(f"{exc.message} (the volume needs it too)") from exc
    cpu_workers = min(CPU_WORKERS_MAX, os.cpu_count() or 1)
    run = _Calibration(ctx, cal, files, size)
    # the session is recorded in the run directory, where every end of the run cleans it
    try:
        volume_ray.start(ray, vspec, ctx.run_dir, cpu_workers)
    except Exception as exc:  # Ray's own trouble: the pilot still stands, its forecast alone
        volume_ray.stop(ray, [], ctx.run_dir)
        run.close_scratch()
        raise StageSkipped(f"Ray did not start on this node ({type(exc).__name__}: "
                           f"{str(exc)[:300]}); the volume starts it the same way") from exc
    actors: List[Any] = []
    try:
        run.facts["ray_start_s"] = round(time.perf_counter() - began, 3)
        from runner.volume_workers import worker_count

        count = min(worker_count(ray, vspec, cpu_workers),
                    max(1, len(files) // size))
        if count < 1:
            raise StageSkipped("this node offers no worker for the volume "
                               f"({vspec.cards_per_worker} card(s) per worker)")
        actors = run.start_workers(ray, vspec, count)
        run.facts["workers_ready_s"] = round(time.perf_counter() - began, 3)
        run.warm_up(ray, actors)
        run.timed_batches(ray, actors)
        run.driver_pace(ray, actors)
    finally:
        stopping = time.perf_counter()
        volume_ray.stop(ray, actors, ctx.run_dir)
        run.facts["ray_stop_s"] = round(time.perf_counter() - stopping, 3)
        run.close_scratch()
    return run.facts


def _listing(cal: CalibrationSpec) -> List[Item]:
    try:
        files = list_dir(cal.dir, cal.pattern or "*")
    except InputsError as exc:
        raise StageSkipped(f"the volume's inputs cannot be listed on this node: {exc}") from exc
    if not files:
        raise StageSkipped(f"the volume's inputs ({cal.dir}, {cal.pattern}) are empty on "
                           "this node")
    return files


class _Calibration:
    """One calibration's sample, its workers' calls and what they measured."""

    def __init__(self, ctx: StageContext, cal: CalibrationSpec, files: List[Item],
                 size: int) -> None:
        self.ctx, self.cal, self.size = ctx, cal, size
        self.dir = os.path.join(ctx.run_dir, CALIBRATION_DIR)
        os.makedirs(os.path.join(self.dir, "outputs"), exist_ok=True)
        self.sample = draw_sample(files, cal.seed, cal.sample_size(CPU_WORKERS_MAX))
        self.next = 0
        self.facts: Dict[str, Any] = {
            "inputs_dir": cal.dir, "pattern": cal.pattern,
            "listed": cal.listed or len(files),
            "listed_bytes": cal.listed_bytes if cal.listed else sum(f.size for f in files),
            "seed": cal.seed,
            "batch_size": size, "batches_min": cal.batches, "warmup": [], "batches": [],
            "warmup_ids": [], "sample_ids": [], "failed_batches": 0, "errors": [],
            "record": []}
        if cal.listed:  # a sample the bot drew of a corpus this node does not hold
            self.facts.update(drawn_on=cal.drawn_on, sample_sent=len(files),
                              sample_sent_bytes=sum(f.size for f in files))
        self.open_scratch(self.sample)

    def take(self, again: bool = False, whole: bool = False) -> Optional[List[Item]]:
        """The next batch of the sample; None when it is used up. ``whole``: a full batch
        of the volume's size or none (a timed batch). ``again``: a volume too small for the
        calibration's batches runs its inputs again (timed, not recorded twice)."""
        if len(self.sample) <= self.size:  # the whole volume is one batch, or less
            if self.next and not again:
                return None
            self.next = len(self.sample)
            return list(self.sample)
        left = len(self.sample) - self.next
        if left <= 0 or (whole and left < self.size):
            if not again:
                return None
            self.facts["reused"] = True
            batch = self.sample[self.next:] + self.sample[:self.size - max(0, left)]
            self.next = self.size - max(0, left)
            return batch
        batch = self.sample[self.next:self.next + self.size]
        self.next += len(batch)
        return batch

    def start_workers(self, ray: Any, vspec: VolumeSpec, count: int) -> List[Any]:
        """Start ``count`` workers as the volume does; wait until each loaded the handler."""
        from runner.volume_ray import worker_class

        spec = self.ctx.spec.to_dict()
        spec["inputs"] = {**spec["inputs"], "dir": self.cal.dir, "pattern": self.cal.pattern}
        spec["volume"] = {"cards_per_worker": vspec.cards_per_worker,
                          "batch_size": self.size, "gpus": vspec.gpus}
        spec["calibration"] = None
        cls = worker_class(ray, vspec.cards_per_worker, vspec.gpus)
        device = "cuda" if vspec.gpus else "cpu"
        outputs = os.path.join(self.dir, "outputs")
        actors = [cls.remote(spec, outputs, list(sys.path), device, f"cal-w{k}")
                  for k in range(count)]
        try:
            where = ray.get([a.where.remote() for a in actors], timeout=WAIT_S)
        except Exception as exc:
            raise StageFailure("calibrate", f"the calibration's workers did not start: "
                               f"{type(exc).__name__}: {str(exc)[:300]}",
                               hint="the volume's workers start the same way: look at the "
                                    "Ray logs under calibration/") from exc
        for info in where:
            if info.get("error"):  # skipped, not failed: on a card the pilot's own process
                # still holds its model; the note tells, the volume's workers load the same
                raise StageSkipped(f"a calibration worker could not load the handler "
                                   f"({info['error']}); the volume's workers load it the "
                                   "same way, without the pilot's process beside them")
        self.facts["workers"] = count
        self.facts["threads"] = (where[0] or {}).get("threads") if where else None
        return actors

    def warm_up(self, ray: Any, actors: List[Any]) -> None:
        """One call per worker, all at once (as the volume's workers start), timed apart."""
        calls = []
        for actor in actors:
            batch = self.take()
            if batch is None:
                break
            self.facts["warmup_ids"].extend(i.id for i in batch)
            calls.append((batch, actor.run.remote(_payload(batch))))
        for batch, ref in calls:
            answer = ray.get(ref, timeout=WAIT_S)
            seconds = _seconds(answer)
            if "error" in answer:
                self._failed(answer)
            self.facts["warmup"].append({"items": len(batch), "seconds": seconds,
                                         "bytes": sum(i.size for i in batch)})
            self._keep(batch, answer, seconds)

    def timed_batches(self, ray: Any, actors: List[Any]) -> None:
        """At least ``batches`` batches, more while under ``min_s``, one at a time on each
        worker (its own seconds, measured where it runs)."""
        began = time.monotonic()
        out: Dict[Any, Tuple[List[Item], int]] = {}

        def hand(worker: int) -> bool:
            done = len(self.facts["batches"]) + len(out)
            if done >= self.cal.batches_max or (
                    done >= self.cal.batches and time.monotonic() - began >= self.cal.min_s):
                return False
            # the least of batches always, the sample's inputs again if it is that small
            batch = self.take(again=done < self.cal.batches, whole=True)
            if batch is None:
                return False
            out[actors[worker].run.remote(_payload(batch))] = (batch, worker)
            return True

        for k in range(len(actors)):
            hand(k)
        while out:
            ready, _ = ray.wait(list(out), num_returns=1, timeout=WAIT_S)
            if not ready:
                raise StageFailure("calibrate", f"no batch came back within {WAIT_S:g} s",
                                   hint="a hung handler: the volume would hang the same way")
            batch, worker = out.pop(ready[0])
            answer = ray.get(ready[0])
            seconds = _seconds(answer)
            if "error" in answer:
                self._failed(answer)
            else:
                self.facts["batches"].append({"items": len(batch), "worker": worker,
                                              "bytes": sum(i.size for i in batch),
                                              "seconds": seconds})
                self.facts["sample_ids"].extend(i.id for i in batch
                                                if i.id not in self.facts["sample_ids"])
            self._keep(batch, answer, seconds)
            hand(worker)
        self.facts["timed_wall_s"] = round(time.monotonic() - began, 3)

    def driver_pace(self, ray: Any, actors: List[Any]) -> None:
        """Batches this fast may leave the volume bound by its driver: ``PACE_BATCHES`` of
        the sample's go through the volume's own ``Driver`` (its hand-out, in flight, writer
        thread) into scratch files of their own, timed: the driver's pace."""
        wall, timed = self.facts.get("timed_wall_s") or 0.0, len(self.facts["batches"])
        if not timed or wall / timed > PACE_PROBE_S or not actors:
            return
        import dataclasses

        from runner.events import EventWriter
        from runner.ledger import Ledger
        from runner.stage import StageContext as Ctx
        from runner.stages.pilot import Recorder
        from runner.volume_driver import Driver
        from runner.volume_queue import Batch
        from runner.volume_workers import Worker

        self.next = 0
        batches = [Batch(k, list(self.take(again=True, whole=True) or []))
                   for k in range(PACE_BATCHES)]
        items = list({i.id: i for b in batches for i in b.items}.values())
        spec = dataclasses.replace(self.ctx.spec, calibration=None, volume=None,
                                   inputs=dataclasses.replace(self.ctx.spec.inputs,
                                                              dir=self.cal.dir))
        writer = EventWriter(os.path.join(self.dir, "pace-events.jsonl"), spec.run_id)
        ledger = Ledger.open(os.path.join(self.dir, "pace-ledger.sqlite"), new_attempt=True)
        try:
            scratch = Ctx(spec=spec, run_dir=self.dir, emit=writer.emit)
            driver = Driver(scratch, Recorder(scratch, ledger, items, set()), ray,
                            [Worker(k, a) for k, a in enumerate(actors)], batches, 0.0,
                            in_flight=2, prefetch=VolumeSpec().prefetch)
            began = time.perf_counter()
            driver.run()
            self.facts["pace"] = {"batches": len(batches), "in_flight": 2,
                                  "wall_s": round(time.perf_counter() - began, 6)}
        finally:
            ledger.close()
            writer.close()

    def _failed(self, answer: Dict[str, Any]) -> None:
        """A call that raised or ran past its clock: counted, its first errors kept."""
        self.facts["failed_batches"] += 1
        self.facts["errors"] = (self.facts["errors"] + [str(answer["error"])[:300]])[:5]

    def _keep(self, batch: List[Item], answer: Any, seconds: float) -> None:
        """Record a call's results as the driver's writer does (audit, ledger, events,
        JSON outputs), when they come back (the workers still running, as in the volume),
        timed: the driver's recording rate here."""
        if not (isinstance(answer, dict) and "results" in answer) or \
                any(i.id in self.recorder.recorded for i in batch):
            return  # nothing to record, or inputs run again (a small volume): timed only
        began = time.perf_counter()
        self.recorder.record([i.id for i in batch], answer["results"], seconds)
        self.facts["record"].append({"items": len(batch),
                                     "seconds": round(time.perf_counter() - began, 6)})

    def open_scratch(self, items: List[Item]) -> None:
        """The scratch ledger and events file the results are recorded into (never the
        run's: the volume runs these inputs again)."""
        from runner.events import EventWriter
        from runner.ledger import Ledger
        from runner.stage import StageContext as Ctx
        from runner.stages.pilot import Recorder

        self.writer = EventWriter(os.path.join(self.dir, "events.jsonl"),
                                  self.ctx.spec.run_id)
        self.ledger = Ledger.open(os.path.join(self.dir, "ledger.sqlite"), new_attempt=True)
        scratch = Ctx(spec=self.ctx.spec, run_dir=self.dir, emit=self.writer.emit)
        self.recorder = Recorder(scratch, self.ledger, items, set())

    def close_scratch(self) -> None:
        """Close the scratch files; the facts of what was recorded and written."""
        refused = sum(1 for row in self.ledger.rows() if row.status == "refused")
        recorded = len(self.recorder.recorded)
        self.ledger.close()
        self.writer.close()
        files, size = _tree(os.path.join(self.dir, "outputs"))
        took = sum(r["seconds"] for r in self.facts["record"])
        self.facts.update(record_items=recorded, record_s=round(took, 6), refused=refused,
                          output_files=files, output_bytes=size)


def _payload(batch: List[Item]) -> List[List[Any]]:
    """A batch as the worker's ``run`` takes it: (id, path relative to the inputs, size)."""
    return [[i.id, os.path.basename(i.path), i.size] for i in batch]


def _seconds(answer: Any) -> float:
    value = answer.get("seconds") if isinstance(answer, dict) else None
    return round(float(value), 6) if isinstance(value, (int, float)) else 0.0


def _tree(root: str) -> Tuple[int, int]:
    """Files and bytes under ``root`` (links not followed)."""
    files = size = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            files += 1
            size += st.st_size
    return files, size
