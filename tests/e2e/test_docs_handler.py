"""The complete handler of docs/workloads.md, with its manifest, as written there, passes a
pilot run through `preflight run`."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.e2e.test_pilot_cli import REPO, preflight

DOCS = {"inv-1": "INVOICE 12. Amount due: 40 EUR. Payment by transfer.",
        "inv-2": "Invoice for the payment of March.",
        "agr-1": "This agreement binds each party; clause 4 says how.",
        "empty": "Nothing to see here."}


def documented(after: str, language: str) -> str:
    text = (REPO / "docs" / "workloads.md").read_text(encoding="utf-8")
    match = re.search(rf"```{language}\n(.*?)```", text.split(after, 1)[1], re.S)
    assert match, f"docs/workloads.md lost its {language} example after {after!r}"
    return match.group(1)


def test_the_documented_handler_passes_its_pilot(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "my_project").mkdir(parents=True)
    (root / "my_project" / "__init__.py").write_text("")
    (root / "my_project" / "keywords.py").write_text(
        documented("A complete handler (`my_project/keywords.py`", "python"))
    (root / "pilot.yaml").write_text(documented("and its manifest (`pilot.yaml`", "yaml"))
    (root / "data" / "pilot").mkdir(parents=True)
    for name, text in DOCS.items():
        (root / "data" / "pilot" / f"{name}.txt").write_text(text)
    assert preflight(root, "validate", "pilot.yaml").returncode == 0
    done = preflight(root, "run", "pilot.yaml", "--by", "alice")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [p for p in (root / "runs").iterdir() if p.is_dir()]
    balance = json.loads((run_dir / "balance.json").read_text())
    assert (balance["accepted"], balance["refused"], balance["ok"]) == (3, 1, True)
    assert balance["by_category"] == {"invoice": 2, "contract": 1}
    scores = json.loads((run_dir / "outputs" / "agr-1.json").read_text())
    assert scores["scores"]["contract"] == 3
