"""The complete trainer of docs/workloads.md, as written there, passes the training pilot."""

from __future__ import annotations

import re
from pathlib import Path

from tests.runner.test_train import REPO, run_train


def docs_trainer() -> str:
    text = (REPO / "docs" / "workloads.md").read_text(encoding="utf-8")
    after = text.split("A complete trainer (`my_project/train.py`", 1)[1]
    match = re.search(r"```python\n(.*?)```", after, re.S)
    assert match, "docs/workloads.md lost its complete trainer example"
    return match.group(1)


def test_the_documented_own_trainer_passes_the_training_pilot(tmp_path: Path) -> None:
    package = tmp_path / "my_project"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(docs_trainer())
    _, facts = run_train(tmp_path, "my_project.train")
    assert facts["trainer"] == "my_project.train"
    assert facts["bit_identical"] is True and facts["shards"] == 4
