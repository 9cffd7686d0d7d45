"""A submission is read once (issue 25): its text parsed once, the policy's file check run
once, its inputs folder listed once, and that listing is what the balance expects and what
the dispatch re-checks (``inputs.checked.json``).

Parses are counted on the text itself (``parse_text`` strips a byte-order mark first, once
per parse); listings with an audit hook on ``os.listdir``/``os.scandir`` (the runner's
listing and ``Path.iterdir`` both raise these events)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bot.manifest.load import load_manifest
from bot.manifest.project_check import precheck_manifest
from bot.messages.model import RecordingNotifier
from bot.policy import load_policy
from bot.policy.guard import PolicyGuard
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]
_LISTED: list[list[str]] = []  # the listings of the innermost `listings()` block


def _on_audit(event: str, args: tuple[Any, ...]) -> None:
    if _LISTED and event in ("os.listdir", "os.scandir"):
        path = args[0] if args else None
        if isinstance(path, (str, bytes, os.PathLike)):
            _LISTED[-1].append(os.path.realpath(os.fsdecode(path)))


sys.addaudithook(_on_audit)


@contextmanager
def listings() -> Iterator[list[str]]:
    """Every folder listed inside the block, resolved, in order."""
    _LISTED.append([])
    try:
        yield _LISTED[-1]
    finally:
        _LISTED.pop()


class CountedText(str):
    """A manifest text that counts how often it is parsed."""

    parses = 0

    def lstrip(self, chars: str | None = None) -> str:
        if chars == "\ufeff":
            self.parses += 1
        return super().lstrip(chars)


def make(tmp_path: Path) -> PilotService:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"nodes: [local]\nproject_roots: [{tmp_path / 'projects'}]\n"
                      "roles: {approvers: [U0LEAD]}\n",
                      encoding="utf-8")
    return PilotService(settings, Store(settings.db_path),
                        {"local": ScriptedDispatcher(lambda run: pilot_script(IDS, refuse=()))},
                        RecordingNotifier(), policy=load_policy(policy, home=tmp_path),
                        precheck=precheck_manifest)


def checked(run_dir: Path) -> dict[str, Any]:
    record = json.loads((run_dir / "inputs.checked.json").read_text(encoding="utf-8"))
    assert isinstance(record, dict)
    return record


def test_a_slack_submission_is_parsed_once_and_its_inputs_listed_once(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "projects" / "proj", approvers="[U0LEAD]")
    folder = str((manifest.parent / "data" / "pilote").resolve())
    service = make(tmp_path)
    text = CountedText(manifest.read_text(encoding="utf-8"))
    with listings() as listed:
        sub = service.submit_text(text, source=str(manifest), base_dir=manifest.parent,
                                  submitter="U0MEMBER", channel="C0CHAN", thread_ts="1.0",
                                  origin="slack")
    assert text.parses == 1
    assert listed.count(folder) == 1
    run = service.store.get_run(sub.run_id)
    assert service.store.expected_ids(sub.run_id) == IDS and run["channel"] == "C0CHAN"
    record = checked(sub.run_dir)
    assert record["dir"] == folder
    assert record["files"] == {f"{i}.txt": os.path.join(folder, f"{i}.txt") for i in IDS}


def test_a_terminal_submission_is_parsed_once_and_its_inputs_listed_once(
        tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "projects" / "proj", approvers="[U0LEAD]")
    folder = str((manifest.parent / "data" / "pilote").resolve())
    service = make(tmp_path)
    text = CountedText(manifest.read_text(encoding="utf-8"))
    with listings() as listed:
        loaded = load_manifest(text, source=str(manifest), base_dir=manifest.parent)
        sub = service.submit(loaded, submitter="bob")
    assert text.parses == 1
    assert listed.count(folder) == 1
    assert service.store.expected_ids(sub.run_id) == IDS
    assert sorted(checked(sub.run_dir)["files"]) == [f"{i}.txt" for i in IDS]


def test_the_policys_file_check_runs_once_per_slack_submission(tmp_path: Path) -> None:
    """The check of the files from Slack (``PolicyGuard.check_files``) runs when the text is
    loaded, before the project check opens them, and not again when the run is admitted."""
    calls: list[str] = []

    class CountingGuard(PolicyGuard):
        def check_files(self, *args: Any, **kw: Any) -> None:
            calls.append(kw["user"])
            super().check_files(*args, **kw)

    manifest = write_manifest(tmp_path / "projects" / "proj", approvers="[U0LEAD]")
    service = make(tmp_path)
    service.guard = CountingGuard(service.guard.policy, service.store)
    service.records.guard = service.decider.guard = service.guard
    service.submit_text(manifest.read_text(encoding="utf-8"), source=str(manifest),
                        base_dir=manifest.parent, submitter="U0MEMBER", channel="C0CHAN",
                        thread_ts="1.0", origin="slack")
    assert calls == ["U0MEMBER"]
