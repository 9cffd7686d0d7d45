"""`preflight validate | plan | schema | check-project` through the real typer app."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from bot.cli.manifest import register
from tests.bot.manifest_helpers import BASE, dump, make_project, merged


def make_app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(make_app(), list(args))
    return result.exit_code, result.output


def test_validate_exit_codes_and_json(tmp_path: Path) -> None:
    make_project(tmp_path)
    good = tmp_path / "good.yaml"
    good.write_text(dump(BASE))
    code, out = invoke("validate", str(good), "--json")
    assert code == 0 and json.loads(out) == {"valid": True, "errors": [], "warnings": []}
    bad = tmp_path / "bad.yaml"
    bad.write_text(dump(merged(hardware={"lots": 11})))
    code, out = invoke("validate", str(bad), "--json")
    report = json.loads(out)
    assert code == 1 and report["valid"] is False
    [error] = report["errors"]
    assert error["loc"] == "hardware.lots" and error["line"] == 6 and error["column"] == 3
    code, _ = invoke("validate", str(tmp_path / "missing.yaml"))
    assert code == 2


def test_validate_json_has_exactly_the_issue_shape(tmp_path: Path) -> None:
    make_project(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(dump(merged(hardware={"gpu": "B200"}, success={"min_accepted": 12})))
    code, out = invoke("validate", str(bad), "--json")
    report = json.loads(out)
    assert code == 1 and list(report) == ["valid", "errors", "warnings"]
    assert report["valid"] is False
    assert report["errors"] == [{"loc": "success.min_accepted", "line": 28, "column": 3,
                                 "message": "12 cannot be met: 12 inputs - 1 expected "
                                            "refusal(s) = 11 can be accepted"}]
    [warning] = report["warnings"]
    assert list(warning) == ["loc", "line", "column", "message"]
    assert warning["loc"] == "hardware.gpu" and "two cards" in warning["message"]
    unparsable = tmp_path / "broken.yaml"
    unparsable.write_text("apiVersion: [unclosed\n")
    code, out = invoke("validate", str(unparsable), "--json")
    [error] = json.loads(out)["errors"]
    assert code == 2 and list(error) == ["loc", "line", "column", "message"]
    assert isinstance(error["line"], int) and isinstance(error["column"], int)


def test_validate_text_output_names_line(tmp_path: Path) -> None:
    make_project(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(dump(merged(hardware={"days": 5})))
    code, out = invoke("validate", str(bad))
    assert code == 1 and "hardware.days (line 7, column 3)" in out


def test_plan_json_and_text(tmp_path: Path) -> None:
    make_project(tmp_path)
    path = tmp_path / "b200.yaml"
    path.write_text(dump(merged(hardware={"gpu": "B200", "lots": 3, "days": 7,
                                          "lot_price_usd_per_day": "10"})))
    code, out = invoke("plan", str(path), "--json")
    plan = json.loads(out)
    assert code == 0 and plan["total_cards"] == 6 and plan["total_usd"] == "210.00"
    code, out = invoke("plan", str(path))
    assert code == 0 and "10.00 USD × 7 days × 3 lots = 210.00 USD" in out
    assert "3 lots × 2 cards per lot = 6 cards" in out
    assert "10.00 USD (one B200 lot = 2 cards, all covered by this price)" in out
    assert "Total:                  210.00 USD" in out
    path.write_text(dump(merged(hardware={"days": 5})))
    assert invoke("plan", str(path))[0] == 1  # not valid, like validate
    assert invoke("plan", str(tmp_path / "missing.yaml"))[0] == 2  # cannot be read


def test_plan_text_for_one_card(tmp_path: Path) -> None:
    make_project(tmp_path)
    path = tmp_path / "h100.yaml"
    path.write_text(dump(merged(hardware={"lots": 1, "days": 3})))
    code, out = invoke("plan", str(path))
    assert code == 0 and "1 lot × 1 card per lot = 1 card" in out
    assert "2.50 USD × 3 days × 1 lot = 7.50 USD" in out and "covered" not in out


def test_check_project_exit_codes(tmp_path: Path) -> None:
    code, out = invoke("check-project", str(tmp_path / "nope"), "--json")
    assert code == 2
    code, out = invoke("check-project", str(tmp_path), "--json")
    report = json.loads(out)
    assert code == 1 and {"README.md", "requirements-rebuild.txt", "data/pilote"} <= {
        e["loc"] for e in report["errors"]}
