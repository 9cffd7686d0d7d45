"""The run's payloads (balance, evidence, forecast; verdict and stop in test_run_record.py)
are typed once where the run leaves the store (bot/pilot/payloads.py): a row written by an
older version still reads (missing keys take their defaults, unknown keys are ignored), a
cell of the wrong type is named (run, column, field), a node's forged evidence event is
flagged where it enters and never makes its run unreadable; and a step reads its run once
and carries it (issue 33): the outcome of a run is published from one read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.errors import StoreError
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.messages.views import balance_message, evidence_message
from bot.pilot.payloads import Balance, BalanceRow, Evidence, ItemRow, Recount
from bot.pilot.record import Run, RunRecord
from bot.service import PilotService
from bot.service.follower import Follower
from bot.service.publisher import Publisher
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest
from tests.bot.runs import run_of

IDS = ["doc-01", "doc-02", "doc-03"]


def test_the_payloads_are_typed_where_the_run_leaves_the_store() -> None:
    run = run_of(
        balance={"ok": True, "accepted": 2, "refused": 1, "total": 3,
                 "by_category": {"spam": 1, "ham": 1},
                 "problems": [{"kind": "missing", "id": "d-9", "detail": "no outcome"}],
                 "items": [{"id": "d-1", "status": "accepted", "category": "ham",
                            "reason": None}], "items_total": 3,
                 "sample": [{"id": "d-1", "category": "ham", "input_head": "Dear"}],
                 "recheck": {"accepted": 2, "refused": 1, "total": 3, "ok": True}},
        evidence={"dest": "/ev/r-1", "files": 4, "bytes": 100, "verified": True,
                  "verified_by": "node"},
        forecast={"possible": True, "fits": False, "low_s": 60, "high_s": 90.5,
                  "margin_s": -30, "lease_end": "2026-12-06T00:00:00+00:00",
                  "figures": [{"key": "wall", "label": "Wall time", "value": "1 min",
                               "formula": "a + b"}], "notes": ["a note"]})
    bal = run.balance
    assert bal is not None and bal.ok and (bal.accepted, bal.refused, bal.total) == (2, 1, 3)
    assert bal.by_category == (("ham", 1), ("spam", 1))
    assert bal.problems == (BalanceRow("missing", "d-9", "no outcome"),)
    assert bal.items == (ItemRow("d-1", "accepted", "ham"),) and bal.rows == 3
    assert bal.sample[0].result == "ham" and bal.sample[0].input_head == "Dear"
    assert bal.recheck == Recount(2, 1, 3, True)
    assert run.evidence == Evidence(dest="/ev/r-1", verified=True, verified_by="node",
                                    files=4, bytes=100)
    fc = run.forecast
    assert fc is not None and fc.possible and fc.fits is False and not fc.is_check
    assert fc.number("high_s") == 90.5 and fc.number("lease_end") is None
    assert fc.text("lease_end") == "2026-12-06T00:00:00+00:00"
    assert [(f.key, f.label) for f in fc.figures] == [("wall", "Wall time")]
    assert fc.notes == ("a note",) and fc.as_dict()["margin_s"] == -30


def test_a_row_of_an_older_version_reads_with_defaults_and_ignores_unknown_keys() -> None:
    run = run_of(balance={"accepted": 3, "total": 3, "from_the_future": {"x": 1}},
                 evidence={"dest": "/ev/r-1"}, forecast={"actual_s": 12.0, "error_pct": 4})
    assert run.balance == Balance(accepted=3, total=3)  # not ok: "ok" was never said
    assert run.evidence == Evidence(dest="/ev/r-1")  # not verified
    assert run.forecast is not None and run.forecast.is_check and not run.forecast.possible
    assert run.forecast.figures == () and run.forecast.number("error_pct") == 4.0
    # an empty object is no payload, as the readers always took it
    empty = run_of(balance={}, evidence={}, forecast={})
    assert (empty.balance, empty.evidence, empty.forecast) == (None, None, None)


@pytest.mark.parametrize(("column", "value", "named"), [
    ("balance", {"ok": True, "accepted": "2"}, "column balance, field accepted holds '2', "
                                               "not a non-negative integer"),
    ("balance", {"ok": "yes"}, "column balance, field ok holds 'yes', not true or false"),
    ("balance", {"problems": ["boom"]}, "column balance, field problems holds .* not a list "
                                        "of objects"),
    ("balance", {"by_category": {"ham": -1}}, "column balance, field by_category holds .* "
                                              "not a mapping of categories to counts"),
    ("balance", {"recheck": {"accepted": True}}, "column balance.recheck, field accepted"),
    ("evidence", {"dest": 7}, "column evidence, field dest holds 7, not text"),
    ("evidence", {"files": 1.5}, "column evidence, field files holds 1.5"),
    ("forecast", {"fits": "no"}, "column forecast, field fits holds 'no'"),
    ("forecast", {"figures": "many"}, "column forecast, field figures holds 'many'"),
])
def test_a_cell_of_the_wrong_type_is_named_with_its_run_and_field(
        column: str, value: dict[str, Any], named: str) -> None:
    with pytest.raises(StoreError, match=f"run r-1: {named}"):
        run_of(**{column: value})


def test_a_cell_that_is_no_object_is_named(tmp_path: Path) -> None:
    store, run_id = _finished(tmp_path)[1:]
    store.update_run(run_id, balance=["accepted", 3])
    with pytest.raises(StoreError, match=f"run {run_id}: column balance holds list"):
        store.run(run_id)


def test_a_forged_evidence_event_is_flagged_where_it_enters_and_its_run_still_reads() -> None:
    raw = {"dest": ["/etc"], "files": "<b>9</b>", "bytes": 10, "verified": True,
           "problems": []}
    kept = Evidence.from_event(raw)
    assert "dest" not in kept and "files" not in kept and kept["bytes"] == 10
    assert kept["verified"] is False
    assert "dest is [" in kept["malformed"] and "files is '<b>9</b>'" in kept["malformed"]
    run = run_of(evidence=kept)
    assert run.evidence is not None and not run.evidence.verified
    message = evidence_message(run)
    assert message is not None and any(
        "the node's evidence event cannot be read" in str(b) for b in message.blocks)
    # a well-typed event is kept as it came
    good = {"dest": "/ev/r-1", "files": 3, "bytes": 10, "shards": 0, "verified": True}
    assert Evidence.from_event(good) == good


def test_the_messages_read_the_typed_balance() -> None:
    message = balance_message(run_of(balance={
        "ok": False, "accepted": 1, "refused": 0, "total": 2,
        "problems": [{"kind": "missing", "id": "d-2", "detail": "no outcome"}]}))
    assert message is not None and message.summary == \
        "Balance 1 accepted + 0 refused of 2: FAILED"
    flagged = balance_message(run_of(balance={
        "ok": False, "malformed": ["total is 'x'"],
        "recheck": {"accepted": 2, "refused": 0, "total": 2, "ok": True}}))
    assert flagged is not None and "2 accepted + 0 refused of 2 expected" in \
        " ".join(str(b) for b in flagged.blocks)


# -- one run read per step ---------------------------------------------------------------

def _finished(tmp_path: Path) -> tuple[Settings, Store, str]:
    """A pilot submitted, run and judged by a service."""
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    dispatcher = ScriptedDispatcher(lambda run: pilot_script(IDS, refuse=()))
    store = Store(settings.db_path)
    service = PilotService(settings, store, {"local": dispatcher}, RecordingNotifier())
    sub = service.submit(load_manifest_file(write_manifest(tmp_path, count=3)),
                         submitter="bob")
    service.starter.start(sub.run_id)
    Follower(settings, store, {"local": dispatcher},
             Publisher(store, RecordingNotifier())).follow(sub.run_id, timeout=30)
    return settings, store, sub.run_id


def count_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times a run leaves the store from now on (typed with its payloads: ``Run``;
    its record alone: ``RunRecord``) and how many balances are parsed."""
    counts = {"Run": 0, "RunRecord": 0, "Balance": 0}

    def counting(cls: type, name: str, key: str) -> None:
        entry: Callable[..., Any] = getattr(cls, name).__func__

        def counted(klass: type, *args: Any, **kwargs: Any) -> Any:
            if klass is cls:
                counts[key] += 1
            return entry(klass, *args, **kwargs)

        monkeypatch.setattr(cls, name, classmethod(counted))

    counting(Run, "from_row", "Run")
    counting(RunRecord, "from_row", "RunRecord")
    counting(Balance, "from_stored", "Balance")
    return counts


def test_a_runs_outcome_is_published_from_one_read_of_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, store, run_id = _finished(tmp_path)
    counts = count_reads(monkeypatch)
    notifier = RecordingNotifier()
    Publisher(store, notifier).publish_outcome(run_id)  # the report, then the thread
    assert {"verdict", "balance", "decision"} <= {m.key for m in notifier.history}
    assert (Path(store.get_run(run_id)["run_dir"]) / "report.html").is_file()
    # one read of the run, its payloads parsed once, carried to the report and messages
    assert counts == {"Run": 1, "RunRecord": 0, "Balance": 1}, counts
