"""The volume on a Ray cluster: start Ray and the workers, run the driver's pass over
the items left (the other nodes' outputs come to the head after, in the ``collect``
stage).

The pieces, one concept each: the driver's hand-out loop and what it does when a batch
or a worker fails (``runner/volume_driver.py``), the workers and their replacements
(``runner/volume_workers.py``), the batches and their splitting (``volume_queue.py``),
progress and the adaptive time limit (``volume_progress.py``, ``volume_limit.py``), the
Ray session and the worker actor (``volume_ray.py``), the collection of the nodes'
outputs (``volume_collect.py``, ``volume_stream.py``, ``volume_outputs.py``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List

from runner import events as ev
from runner.inputs import Item
from runner.recording import ItemRecorder
from runner.spec import healthy_cards
from runner.stage import StageContext, StageFailure
from runner.volume_driver import Driver
from runner.volume_queue import Batch
from runner.volume_workers import CPU_WORKERS_MAX, Worker, start_workers, worker_factory

__all__ = ["run_volume", "report_node_proofs"]


def run_volume(ctx: StageContext, remaining: List[Item],
               recorder: ItemRecorder) -> Dict[str, Any]:
    """Run ``remaining`` on Ray; returns the pilot stage's volume facts."""
    from runner import volume_ray

    vspec = ctx.spec.volume
    if vspec is None:
        raise StageFailure("pilot", "the spec has no volume section")
    if vspec.gpus and not vspec.address and vspec.cards is None:
        vspec = dataclasses.replace(vspec, cards=healthy_cards(ctx.facts))
    report_node_proofs(ctx, vspec.nodes or [])
    volume_ray.clean_local_session(ctx.run_dir)  # a killed driver's leftovers, if any
    volume_ray.prepare_env(vspec)
    ray = volume_ray.import_ray()
    cpu_workers = vspec.workers or min(CPU_WORKERS_MAX, os.cpu_count() or 1)
    facts = volume_ray.start(ray, vspec, ctx.run_dir, cpu_workers)
    workers: List[Worker] = []  # the driver adds the workers it starts in place of others
    try:
        spawn = worker_factory(ctx, ray, vspec, recorder.ledger.attempt)
        workers.extend(start_workers(ctx, ray, vspec, cpu_workers, spawn))
        size = max(1, int(vspec.batch_size or ctx.spec.task.batch_size or 1))
        batches = [Batch(n, remaining[i:i + size])
                   for n, i in enumerate(range(0, len(remaining), size))]
        from runner.itemtimeout import item_timeout, pilot_item_s

        facts.update(Driver(ctx, recorder, ray, workers, batches,
                            float(vspec.batch_timeout_s or 0),
                            pilot_batch_s=float(vspec.pilot_batch_s or 0),
                            item_timeout_s=item_timeout(ctx.spec),
                            pilot_item_s=pilot_item_s(ctx.spec),
                            in_flight=int(vspec.in_flight or 1),
                            prefetch=int(vspec.prefetch), spawn=spawn).run())
        return facts  # several nodes: their outputs come to the head in the collect stage
    finally:
        volume_ray.stop(ray, [w.actor for w in workers], ctx.run_dir)


def report_node_proofs(ctx: StageContext, nodes: List[Dict[str, Any]]) -> None:
    """Each card a node's proof left out (the dispatcher's, before Ray started), told
    once per driver start as ``volume.card_excluded``."""
    for node in nodes:
        for card in node.get("excluded") or []:
            ctx.emit(ev.VOLUME_CARD_EXCLUDED, node=node.get("where"), host=node.get("host"),
                     cards=[str(card.get("card"))], stage=card.get("stage"),
                     reason=card.get("reason"))
