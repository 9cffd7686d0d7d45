"""The report of a run whose outputs went into shards (issue 35, point 1): its checksum
table reads SHA256SUMS then the shard index, and adding the report keeps the copy whole."""

from __future__ import annotations

from pathlib import Path

from bot.service.report_files import add_to_evidence, first_outputs
from runner.evidence import INDEX, copy_evidence, verify_evidence
from tests.runner.test_evidence_shards import make_run


def test_the_checksum_rows_of_a_sharded_copy_come_from_its_index(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    copy_evidence(str(make_run(tmp_path, 30)), str(dest), plain_max=5, shard_files=10)
    rows, total = first_outputs(dest / INDEX, 12)
    assert total == 30 and len(rows) == 12
    assert rows[0][1] == "outputs/doc-00000.json" and len(rows[0][0]) == 64
    add_to_evidence(dest, "report.html", b"<html></html>")
    checked = verify_evidence(str(dest))
    assert checked.ok, checked.problems
    assert checked.shards == 3


def test_the_evidence_message_says_the_outputs_are_in_shards() -> None:
    from bot.messages.model import Fields
    from bot.messages.views import evidence_message
    from tests.bot.runs import run_of

    run = run_of(id="r1", evidence={"dest": "/ev/r1", "files": 20_006, "bytes": 1,
                                    "shards": 2, "verified": True})
    message = evidence_message(run)
    assert message is not None
    fields = dict(next(b for b in message.blocks if isinstance(b, Fields)).pairs)
    assert fields["Files"] == "20006 (the outputs in 2 shards, docs/evidence.md)"
