"""The volume head's card stages, taken from its card proof of this dispatch (issue 23).

Before a several-node volume's Ray starts, the dispatcher runs the card stages on every
node (``bot/dispatch/card_proof.py``: ``python -m runner --stages ...`` in
``<node run dir>/card-proof``). The head's runner would run the same stages on the same
cards a few seconds later. Instead, when the spec's ``volume.head_proof`` names that proof
(``dir``, ``run``, ``finished_at``: the ``ts`` of the proof's ``run.finished`` event, as
the dispatcher read it), the head takes each card stage that *passed* in it from the proof's
own ``events.jsonl`` on this node, its facts marked ``proven_by``. Anything else runs the
stage: no ``head_proof`` (a pilot, a one-node volume, the proof itself), the proof's file
missing or unreadable here (another node), a ``run.finished`` of another run or another
time (an earlier attempt's proof), or a stage that did not pass in the proof.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

from runner import events as ev
from runner.spec import CARD_STAGES, RunSpec


def proof_stages(spec: RunSpec) -> Dict[str, Dict[str, Any]]:
    """The card stages this run may take from its card proof, by name: each a stage
    result (``status``, ``facts`` with ``proven_by``, ``seconds``); {} to run them all."""
    proof = spec.volume.head_proof if spec.volume is not None else None
    if not isinstance(proof, dict) or proof.get("run") != spec.run_id \
            or not proof.get("finished_at") or not isinstance(proof.get("dir"), str):
        return {}
    path = os.path.join(proof["dir"], "events.jsonl")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    stages: Dict[str, Dict[str, Any]] = {}
    finished = None
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("run") != spec.run_id:
            continue
        etype, stage = event.get("type"), event.get("stage")
        if etype == ev.RUN_FINISHED:
            finished = event
        elif stage in CARD_STAGES and etype in (ev.STAGE_PASSED, ev.STAGE_FAILED,
                                                ev.STAGE_SKIPPED):
            stages[str(stage)] = event
    if finished is None or finished.get("ts") != proof["finished_at"]:
        return {}
    proven_by = {"card_proof": proof["dir"], "at": proof["finished_at"]}
    return {name: {"status": "passed", "seconds": event.get("seconds"),
                   "facts": {**(event.get("facts") or {}), "proven_by": proven_by}}
            for name, event in stages.items() if event.get("type") == ev.STAGE_PASSED}


__all__ = ["proof_stages"]
