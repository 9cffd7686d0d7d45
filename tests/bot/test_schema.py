"""The exported JSON Schema accepts every example manifest and rejects broken ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from bot.manifest.load import manifest_json_schema
from tests.bot.manifest_helpers import BASE, merged
from tests.bot.test_manifest_cli import make_app

REPO = Path(__file__).resolve().parents[2]


def schema_from_cli() -> dict[str, Any]:
    result = CliRunner().invoke(make_app(), ["schema"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def test_schema_is_valid_and_accepts_every_example() -> None:
    schema = schema_from_cli()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    examples = sorted((REPO / "manifests").glob("*.yaml"))
    assert len(examples) >= 2
    for path in examples:
        data = json.loads(json.dumps(yaml.safe_load(path.read_text()), default=str))
        errors = [e.message for e in validator.iter_errors(data)]
        assert errors == [], f"{path.name}: {errors}"
    assert not list(validator.iter_errors(BASE))


@pytest.mark.parametrize("broken", [
    merged(hardware={"days": 5}), merged(hardware={"lots": 11}), merged(backend="metal"),
    merged(apiVersion="preflight/v0"), merged(inputs=None),
    merged(task={"colour": "red"}), {**BASE, "extra": 1},
])
def test_schema_rejects_broken_manifests(broken: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(manifest_json_schema())
    assert list(validator.iter_errors(broken))


def test_shipped_schema_file_is_current() -> None:
    shipped = json.loads((REPO / "docs" / "manifest.schema.json").read_text())
    assert shipped == manifest_json_schema(), \
        "regenerate it: preflight schema > docs/manifest.schema.json"
