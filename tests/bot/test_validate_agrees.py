"""`validate` and `plan` report what `run` would refuse, and what the runner would find
from the manifest and the project alone (handler typos, a missing evidence place)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bot.manifest_helpers import dump, locs, make_project, merged
from tests.bot.test_manifest_cli import invoke

SENTIMENT = "import re\n\nWORDS = {}\n\n\ndef handle(items, ctx):\n    return []\n"


def project(root: Path) -> Path:
    make_project(root)
    (root / "src").mkdir()
    (root / "src" / "__init__.py").write_text("")
    (root / "src" / "sentiment.py").write_text(SENTIMENT)
    return root


def test_a_handler_module_typo_is_a_problem_with_did_you_mean(tmp_path: Path) -> None:
    found = locs(project(tmp_path), dump(merged(task={"handler": "src.sentimnt:handle"})))
    problem = found["task.handler"]
    assert "module 'src.sentimnt' not found" in problem.message
    assert "did you mean 'src.sentiment'?" in problem.message and problem.line is not None


def test_a_handler_function_typo_is_a_problem_with_did_you_mean(tmp_path: Path) -> None:
    found = locs(project(tmp_path), dump(merged(task={"handler": "src.sentiment:handel"})))
    message = found["task.handler"].message
    assert "'handel' is not defined in src/sentiment.py" in message
    assert "did you mean 'handle'?" in message


def test_a_trainer_that_does_not_exist_is_a_problem(tmp_path: Path) -> None:
    text = dump(merged(purpose="training", task={"kind": "train", "handler": None,
                                                 "categories": None,
                                                 "trainer": "my_project.train"}))
    assert "module 'my_project.train' not found" in \
        locs(project(tmp_path), text)["task.trainer"].message


def test_a_training_pilot_needs_no_handler(tmp_path: Path) -> None:
    (project(tmp_path) / "trainer_mod.py").write_text("def read(i, p):\n    return [], {}\n")
    good = tmp_path / "train.yaml"
    good.write_text(dump(merged(purpose="training", task={
        "kind": "train", "handler": None, "categories": None, "trainer": "trainer_mod"})))
    code, out = invoke("validate", str(good), "--json")
    assert code == 0, out


def test_require_evidence_without_copy_to_is_a_problem(tmp_path: Path) -> None:
    make_project(tmp_path)
    bad = tmp_path / "m.yaml"
    bad.write_text(dump(merged(success={"require_evidence": True})))
    code, out = invoke("validate", str(bad), "--json")
    assert code == 1
    [error] = json.loads(out)["errors"]
    assert error["loc"] == "success.require_evidence" and "results.copy_to" in error["message"]


def test_a_params_path_outside_the_project_fails_validate_and_plan(tmp_path: Path) -> None:
    make_project(tmp_path)
    bad = tmp_path / "m.yaml"
    bad.write_text(dump(merged(project={"dir": ".",
                                        "params": {"config": "/home/alice/params.yaml"}})))
    for command in ("validate", "plan"):
        code, out = invoke(command, str(bad), "--json")
        assert code == 1, (command, out)
        errors = json.loads(out)["errors"]
        assert any(e["loc"] == "project.params.config" and e["line"] for e in errors), errors


def test_a_duplicate_key_does_not_hide_the_other_errors(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(merged(hardware={"lots": 0}, bogus=1)).replace(
        "name: pilot-test\n", "name: pilot-test\nname: again\n")
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    code, out = invoke("validate", str(path), "--json")
    assert code == 1
    found = {e["loc"] for e in json.loads(out)["errors"]}
    assert {"name", "hardware.lots", "bogus"} <= found, found
