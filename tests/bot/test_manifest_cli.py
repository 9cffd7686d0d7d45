"""`preflight validate | plan | schema | check-project` through the real typer app."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from bot.cli_manifest import register
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
    path.write_text(dump(merged(hardware={"days": 5})))
    assert invoke("plan", str(path))[0] == 2


def test_check_project_exit_codes(tmp_path: Path) -> None:
    code, out = invoke("check-project", str(tmp_path / "nope"), "--json")
    assert code == 2
    code, out = invoke("check-project", str(tmp_path), "--json")
    report = json.loads(out)
    assert code == 1 and {"README.md", "requirements-rebuild.txt", "data/pilote"} <= {
        e["loc"] for e in report["errors"]}
