"""`preflight fetch RUN`: an ended run's results brought back again.

A fetch refused at the run's end (a node's answer the bot would not take, a node out of
reach, a copy that did not verify) loses nothing already recorded: the events, the
balance and the verdict judged from them stay, and the evidence record says why the copy
was refused (``fetch_error``, which fails the verdict's check "the results were brought
back"). Fetching again runs the same fetch, with every check it makes; what it brings back
replaces the evidence record, and a run that still awaits its decision (or a volume run)
is judged again on it. A decided or stopped run keeps its verdict: the decision was taken
on it; only its evidence record changes.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from bot.dispatch.base import Dispatcher
from bot.errors import DispatchError, PreflightError
from bot.pilot.payloads import Evidence
from bot.pilot.states import ENDED, S
from bot.pilot.verdict import judge
from bot.service.handles import handle_for
from bot.service.publisher import Publisher
from bot.service.report_files import settle_evidence
from bot.store import Store
from runner.events import EVIDENCE, RUN_FINISHED

log = logging.getLogger(__name__)
JUDGED_AGAIN = frozenset({S.AWAITING_DECISION, S.FINISHED})


def fetch_again(store: Store, dispatcher: Dispatcher, publisher: Publisher,
                run_id: str) -> dict[str, Any]:
    """Fetch the ended run's results again; the run as stored after. A fetch that fails
    again is recorded (its ``fetch_error``) and raised."""
    found = store.find(run_id)
    if found.status not in ENDED:
        raise DispatchError(f"run {found.id} is {found.status}: its results are fetched when "
                            "its runner has ended")
    with publisher.run_lock(found.id):
        record = store.run(found.id)
        after = record.resume_seq
        finished = store.events_of_type(record.id, RUN_FINISHED, after_seq=after)
        if not finished:
            raise DispatchError(f"run {record.id}: its runner did not finish, so there are no "
                                f"results to fetch; `preflight resume {record.id}` runs it on")
        claims = store.events_of_type(record.id, EVIDENCE, after_seq=after)
        claimed = Evidence.from_event(claims[-1].data) if claims else None
        error: PreflightError | None = None
        try:
            # asked for by a person: the bot host's ceiling, not the run's sized caps
            evidence = settle_evidence(record, claimed, dispatcher.fetch_results(
                replace(handle_for(record), ceiling=True)))
        except PreflightError as exc:
            error = exc
            evidence = {**(settle_evidence(record, claimed, None) or {}), "verified": False,
                        "fetch_error": str(exc)}
        fields: dict[str, Any] = {"evidence": evidence}
        if record.status in JUDGED_AGAIN:
            typed = Evidence.from_stored(record.id, evidence) if evidence else None
            verdict = judge(replace(record, evidence=typed), store.stages(record.id),
                            finished[-1].data)
            fields.update(verdict=verdict, outcome="passed" if verdict["passed"] else "failed")
        store.update_run(record.id, **fields)
    publisher.publish_outcome(record.id)
    if error is not None:
        log.warning("run %s: the results were not fetched again: %s", record.id, error)
        raise error
    return store.get_run(record.id)
