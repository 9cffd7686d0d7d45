"""report.html takes nothing of a node's unescaped (issue 32, Medium 4): a forged balance
event (HTML in ``total``, ``ok: true`` over a failing run) is flagged where it is taken in
and never drawn; every text is escaped; the page forbids scripts (a Content-Security-
Policy); a stage whose name is mathtext that the parser cannot take still gets its page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.messages.views import balance_message
from bot.pilot.balance_check import balance_problems, checked_balance
from tests.bot.fakes import pilot_script
from tests.bot.test_report import parse
from tests.bot.test_service import make, submit

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]
FORGED = ('4 expected: holds</p><p class="ok">ALL CHECKS PASSED</p>'
          '<script>alert(document.cookie)</script><p hidden>')
MATH = "$" + "x^{" * 300 + "x" + "}" * 300 + "$"


def forged_script(run_id: str) -> list[dict[str, Any]]:
    events = pilot_script(IDS, refuse=(), drop=("doc-04",))
    for event in events:
        if event["type"] == "balance":
            event.update(total=FORGED, ok=True, problems="none")
    at = next(i for i, e in enumerate(events) if e["type"] == "stage.started"
              and e["stage"] == "pilot")
    events[at:at] = [{"type": "stage.started", "stage": name} for name in (MATH, "<b>x</b>")]
    return events


def test_a_forged_balance_event_is_flagged_and_never_drawn(tmp_path: Path) -> None:
    service, notifier = make(tmp_path, forged_script)
    run_id = submit(service, tmp_path)
    run = service.follower.follow(run_id, timeout=30)
    assert run["outcome"] == "failed"
    assert run["balance"]["ok"] is False and run["balance"]["malformed"]
    assert not any(c["ok"] for c in run["verdict"]["checks"]
                   if "balance" in c["text"])
    html = (Path(run["run_dir"]) / "report.html").read_text(encoding="utf-8")
    page = parse(html)
    assert "script" not in page.tags and "<script" not in html
    assert '<p class="ok">ALL CHECKS PASSED' not in html and FORGED not in html
    assert ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "style-src 'unsafe-inline'; img-src data:; script-src 'none'\">") in html
    balance = page.sections["balance"]
    assert "cannot be read, so it is not shown" in balance and "FAILS" in balance
    assert "total is '4 expected" in balance  # the reason, escaped, beside the flag
    assert "Recounted from the item events the bot recorded: 3 accepted + 0 refused" \
        in balance
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html  # a stage name, escaped
    assert "stages" in page.sections and page.svgs >= 1  # the mathtext name was drawn as is
    message = balance_message(service.store.run(run_id))
    assert message is not None and "cannot be read" in message.summary


@pytest.mark.parametrize(("raw", "why"), [
    ({"accepted": 1, "refused": 0, "total": "1", "ok": True}, "total is '1'"),
    ({"accepted": -1, "refused": 0, "total": 1, "ok": True}, "accepted is -1"),
    ({"accepted": True, "refused": 0, "total": 1, "ok": True}, "accepted is True"),
    ({"accepted": 1, "refused": 0, "total": 1, "ok": "yes"}, "ok is 'yes'"),
    ({"accepted": 1, "refused": 0, "total": 1, "ok": True, "problems": ["x"]},
     "problems is not a list of objects"),
    ({"accepted": 1, "refused": 0, "total": 1, "ok": True, "by_category": {"a": "1"}},
     "by_category is not a mapping"),
    ({"accepted": 1, "refused": 0, "total": 2, "ok": False, "forgotten_pending": "1"},
     "forgotten_pending is '1'"),
    (["not", "an", "object"], "not a JSON object")])
def test_each_wrong_type_is_named(raw: Any, why: str) -> None:
    found = balance_problems(raw)
    assert any(why in p for p in found), found
    flagged = checked_balance(raw)
    assert flagged is not None and flagged["ok"] is False and "total" not in flagged


def test_a_well_typed_balance_is_kept_as_it_came() -> None:
    raw = {"accepted": 3, "refused": 1, "total": 4, "ok": True, "problems": [],
           "by_category": {"invoice": 3}, "sample": [{"id": "doc-01"}]}
    assert checked_balance(raw) == raw and balance_problems(raw) == []
