"""report.html: parsed as HTML, every section present, figures equal to the run's JSON,
nothing external; the training resume plot; the picture for Slack."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from bot.errors import DecisionRefused
from bot.messages.model import Attachment
from bot.messages.report import ReportData, render_report
from tests.bot.runs import run_of
from tests.bot.test_forecast_service import finished_pilot

SECTIONS = {"verdict", "plan", "forecast", "stages", "devices", "compute", "memory",
            "balance", "decisions", "checksums"}
XMLNS = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}  # names, not fetched


class Page(HTMLParser):
    """Text per section id, every attribute, the inline SVGs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: dict[str, str] = {}
        self.current: list[str] = []
        self.attrs: list[tuple[str, str]] = []
        self.svgs = 0
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs += [(k, v or "") for k, v in attrs]
        ident = dict(attrs).get("id")
        if tag in ("section", "header") and ident:
            self.current.append(ident)
            self.sections[ident] = ""
        self.svgs += tag == "svg"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("section", "header") and self.current:
            self.current.pop()

    def handle_data(self, data: str) -> None:
        if self.current:
            self.sections[self.current[-1]] += data + " "


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def assert_offline(text: str, page: Page) -> None:
    for key, value in page.attrs:
        if key in ("src", "href", "xlink:href", "data", "action"):
            assert value.startswith("#"), (key, value)  # only references inside the page
    assert not {"script", "link", "iframe", "img", "object"} & page.tags
    assert all(ref.startswith("#") for ref in re.findall(r"url\(\s*['\"]?([^)'\"]*)", text))
    assert "@import" not in text
    assert set(re.findall(r"https?://[^\s\"'<>)]+", text)) <= XMLNS


def test_the_report_of_a_pilot_has_every_section_and_the_run_s_figures(
        tmp_path: Path) -> None:
    service, notifier, run_id = finished_pilot(
        tmp_path, datetime.now(timezone.utc) - timedelta(hours=1))
    with pytest.raises(DecisionRefused):
        service.decider.decide(run_id, "approve", "ok", "mallory")
    service.decider.decide(run_id, "approve", "forecast fits", "alice")
    run = service.store.get_run(run_id)
    html_path = Path(run["run_dir"]) / "report.html"
    text = html_path.read_text(encoding="utf-8")
    page = parse(text)
    assert SECTIONS <= set(page.sections)
    assert_offline(text, page)
    assert page.svgs >= 2  # the stage timeline and the throughput, at least
    plan = page.sections["plan"]
    assert run["plan"]["formula"] in plan and f"{run['plan']['total_usd']} USD" in plan
    forecast = " ".join(page.sections["forecast"].split())
    for figure in run["forecast"]["figures"]:
        assert figure["value"] in forecast and " ".join(figure["formula"].split()) in forecast
    balance = page.sections["balance"]
    assert f"{run['balance']['accepted']} accepted + {run['balance']['refused']} refused" \
        in balance
    decisions = page.sections["decisions"]
    assert "REFUSED" in decisions and "mallory is not an approver" in decisions
    assert "forecast fits" in decisions
    spec_sum = hashlib.sha256((Path(run["run_dir"]) / "spec.json").read_bytes()).hexdigest()
    assert spec_sum in page.sections["checksums"]
    # the verdict message carries the report and its picture (Slack uploads them)
    verdict = notifier.latest[(run_id, "verdict")]
    files = {b.title for b in verdict.blocks if isinstance(b, Attachment)}
    assert files == {"report.html", "report-summary.png"}
    assert (Path(run["run_dir"]) / "report-summary.png").read_bytes()[:4] == b"\x89PNG"


def test_a_training_pilot_shows_the_resume_losses() -> None:
    stages: list[dict[str, Any]] = [
        {"stage": "pilot", "state": "passed", "started_at": "2026-12-03T10:00:00+00:00",
         "ended_at": "2026-12-03T10:00:04+00:00",
         "facts": {"losses_a": [1.0, 0.8, 0.6, 0.5], "losses_b": [1.0, 0.8],
                   "losses_c": [0.6, 0.5], "bit_identical": True}}]
    run = run_of(id="r1", name="train", attempt=1, status="awaiting_decision",
                 kind="pilot", run_dir="/nonexistent", plan={}, verdict=None)
    text = render_report(ReportData(run=run, stages=stages, decisions=[],
                                    generated_at="2026-12-03T10:01:00+00:00"))
    page = parse(text)
    assert "resume" in page.sections and "C continues A bit for bit" in page.sections["resume"]
    assert page.svgs == 2  # the stage timeline and the losses
    assert "No balance was produced" in page.sections["balance"]
    assert_offline(text, page)


def test_report_text_is_escaped() -> None:
    run = run_of(id="r1", name="<script>alert(1)</script>", attempt=1, status="x",
                 run_dir="/n", plan={"formula": "<b>"})
    text = render_report(ReportData(run=run, stages=[], decisions=[], generated_at="now"))
    assert "<script>" not in text and "&lt;script&gt;" in text


def test_a_run_whose_runner_died_still_gets_its_report(tmp_path: Path) -> None:
    from tests.bot.fakes import pilot_script
    from tests.bot.test_service import IDS, make, submit

    service, _ = make(tmp_path, lambda run: pilot_script(IDS, finish=False), exit_code=-9)
    run = service.follower.follow(submit(service, tmp_path), timeout=30)
    text = (Path(run["run_dir"]) / "report.html").read_text(encoding="utf-8")
    page = parse(text)
    assert "FAILED" in page.sections["verdict"] and "RunnerExited" in page.sections["verdict"]
    assert "No volume section" in page.sections["forecast"]
    assert_offline(text, page)


def test_a_report_of_100_000_outputs_stays_small_and_says_what_it_left_out(
        tmp_path: Path) -> None:
    """Every per-item table is cut at REPORT_ROWS with how many more and where they are:
    100,000 checksums, problems and categories (and as many item times) make < 1 MB."""
    from bot.messages.report import REPORT_ROWS
    from bot.service.report_files import first_sums

    n = 100_000
    sums = tmp_path / "SHA256SUMS"
    with sums.open("w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(f"{hashlib.sha256(str(i).encode()).hexdigest()}  outputs/doc-{i:06d}.json\n")
        fh.write(f"{'0' * 64}  report.html\n")  # the report's own line: not counted
    shown, total = first_sums(sums)
    assert total == n and len(shown) == REPORT_ROWS and shown[0][1] == "outputs/doc-000000.json"
    balance = {"ok": False, "accepted": n, "refused": 0, "total": n,
               "by_category": {f"cat-{i:06d}": 1 for i in range(n)},
               "problems": [{"kind": "missing", "id": f"doc-{i:06d}",
                             "detail": "never returned (silent disappearance)"}
                            for i in range(n)]}
    run = run_of(id="r1", name="million", attempt=1, status="done", kind="volume",
                 run_dir="/runs/r1", balance=balance)
    text = render_report(ReportData(
        run=run, stages=[{"stage": "work", "state": "passed",
                          "started_at": "2026-12-03T10:00:00+00:00",
                          "ended_at": "2026-12-03T11:00:00+00:00"}], decisions=[],
        generated_at="now", item_times=[i * 0.036 for i in range(n)],
        checksums=shown, checksums_from=f"SHA256SUMS of the evidence copy at {tmp_path}",
        checksums_total=total, checksums_rest=f"SHA256SUMS in the evidence copy {sums}"))
    assert len(text.encode("utf-8")) < 1_000_000
    page = parse(text)
    more = n - REPORT_ROWS
    assert f"… and {more} more: see SHA256SUMS in the evidence copy {sums}" \
        in page.sections["checksums"]
    assert "doc-000199.json" in text and "doc-000200.json" not in text
    assert f"… and {more} more: see balance.json in the run directory /runs/r1" \
        in page.sections["balance"]
    assert f"… and {more} more: see balance.csv in the run directory /runs/r1" \
        in page.sections["balance"]
    assert_offline(text, page)
