"""A refusal nobody expected is named in the verdict, even when the pilot passes (issue
37, point 6): a warning line with each id and its reason, counted against max_refused."""

from __future__ import annotations

from bot.messages.views import verdict_message
from bot.pilot.verdict import judge
from tests.bot.runs import run_of

STAGES = [{"stage": "pilot", "state": "passed", "facts": {}}]
RAISED = "task.handler raised KeyError: 'lang' (at /proj/team/handler.py:42)"


def _balance(*warned: tuple[str, str], count: int | None = None) -> dict[str, object]:
    warnings = [{"kind": "unexpected_refusal", "id": iid,
                 "detail": f"refused but not an expected refusal: {reason}"}
                for iid, reason in warned]
    balance: dict[str, object] = {"ok": True, "accepted": 4990, "refused": 10,
                                  "total": 5000, "problems": [], "warnings": warnings}
    if count is not None:
        balance["warnings_count"] = count
    return balance


def test_a_passed_verdict_names_the_refusals_nobody_expected() -> None:
    run = run_of(balance=_balance(("doc-00017", RAISED), ("doc-00051", "empty page")),
                 success={"max_refused": 10})
    verdict = judge(run, STAGES, {"status": "passed"})
    assert verdict["passed"]  # counted against max_refused as before: 10 ≤ 10
    warned = [c for c in verdict["checks"] if c.get("warn")]
    assert [c["text"] for c in warned] == [
        "2 refusal(s) outside expected_refusals, counted against max_refused: doc-00017 "
        f"({RAISED}); doc-00051 (empty page); where the handler raised: "
        "handler_errors.jsonl in the run directory"]
    shown = verdict_message(run_of(verdict=verdict))
    assert any(getattr(b, "text", "").startswith("⚠ 2 refusal(s) outside expected_refusals")
               and b.style == "warn" for b in shown.blocks)


def test_many_unexpected_refusals_are_counted_and_the_first_named() -> None:
    warned = [(f"doc-{n:05d}", "empty page") for n in range(8)]
    verdict = judge(run_of(balance=_balance(*warned, count=300)), STAGES, {})
    text = next(c["text"] for c in verdict["checks"] if c.get("warn"))
    assert text.startswith("300 refusal(s) outside expected_refusals")
    assert "doc-00004 (empty page); and 295 more (balance.csv)" in text
    assert "doc-00005" not in text
    assert not [c for c in judge(run_of(balance=_balance()), STAGES, {})["checks"]
                if c.get("warn")]


def test_a_volume_whose_lost_outputs_were_run_again_says_so_in_a_passed_verdict() -> None:
    lost = ("73 ledger row(s) forgotten because their outputs were lost by the node that "
            "wrote them (lost_outputs.jsonl; the ledger's forgotten table): their inputs are "
            "run again by a resume")
    balance = _balance(("doc-00051", "empty page"))
    balance["warnings"] = [{"kind": "outputs_lost", "id": None, "detail": lost},
                           *balance["warnings"]]  # type: ignore[misc]
    verdict = judge(run_of(balance=balance), STAGES, {"status": "passed"})
    assert verdict["passed"]
    warned = [c["text"] for c in verdict["checks"] if c.get("warn")]
    assert warned[1:] == [lost] and warned[0].startswith("1 refusal(s) outside")
