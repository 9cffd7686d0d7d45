"""The terminal speaks plainly: the command to type where the chat shows a button, and a
CPU node's memory named as system RAM."""

from __future__ import annotations

from rich.console import Console

from bot.console.render import to_rich, to_text
from bot.messages import views
from bot.messages.model import Actions, Button, Message
from tests.bot.runs import run_of

RUN = "20261203T100000000Z-demo-a1"


def _rich(message: Message) -> str:
    console = Console(width=200, record=True)
    console.print(to_rich(message))
    return console.export_text()


def test_the_decision_shows_the_decide_commands_not_button_labels() -> None:
    message = views.decision_message(run_of(id=RUN, name="demo", kind="pilot",
                                            status="awaiting_decision"), [])
    for text in (to_text(message), _rich(message)):
        assert "[approve]" not in text and "[revise]" not in text
        for action in ("approve", "fix-env", "revise"):
            assert f'preflight decide {RUN} {action} --reason "…" --by NAME' in text


def test_a_running_run_shows_the_stop_command() -> None:
    message = Message(RUN, "status", (Actions((Button("stop", "Stop the run", RUN, "danger"),)),))
    for text in (to_text(message), _rich(message)):
        assert "[stop]" not in text
        assert 'Stop the run' in text and f'preflight stop {RUN} --reason "…"' in text


def test_a_cpu_node_s_status_line_names_its_ram() -> None:
    from bot.messages.views import KEY_FACTS

    assert "ram_gib" in KEY_FACTS["device"]  # runner.stages.device.cpu_facts


def _at(width: int, message: Message) -> str:
    console = Console(width=width, record=True)
    console.print(to_rich(message))
    return console.export_text()


def _words(panel: str) -> str:
    """The panel's text without its borders, its lines joined by single spaces."""
    return " ".join(" ".join(line.strip("│╭╮╰╯─ ").split()) for line in panel.splitlines())


def test_at_80_columns_a_command_to_type_back_is_never_cut_nor_folded() -> None:
    """A team's run id (a longer name) at 80 columns: each command is whole, its run id on
    one line (it was folded mid-id beside its label), in the live panel as in the
    decision's; it wraps at its spaces only (issue 37)."""
    run = "20261203T100000000Z-vectors-torch-json-five-thousand-a1"
    stop = Message(run, "status", (Actions((Button("stop", "Stop the run", run, "danger"),)),))
    text = _at(80, stop)
    assert f"preflight stop {run}" in text  # the id whole, on the command's first line
    assert f'preflight stop {run} --reason "…"' in _words(text)
    decision = views.decision_message(run_of(id=run, name="vectors-torch-json-five-thousand",
                                             kind="pilot", status="awaiting_decision"), [])
    text = _at(80, decision)
    for action in ("approve", "fix-env", "revise"):
        assert f"preflight decide {run}" in text, action
        assert f'preflight decide {run} {action} --reason "…" --by NAME' in _words(text)


def test_lease_list_never_cuts_the_node_key(tmp_path: object) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    home = Path(str(tmp_path))
    node = "ssh5.some-gpu-rental-marketplace.example.net:41022"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    env.update(PREFLIGHT_HOME=str(home), COLUMNS="80")
    for args in (["lease", "set", node, "ordered", "--by", "alice", "--starts-at",
                  "2026-03-01T09:00:00+01:00", "--days", "7"], ["lease", "list"]):
        done = subprocess.run([sys.executable, "-m", "bot", *args], cwd=home, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    assert node in done.stdout and "…" not in done.stdout


def test_the_approval_hint_names_who_may_approve() -> None:
    """`--by NAME`, but whose name? The approvers, and with two_person not the submitter
    (issue 37)."""
    run = run_of(id=RUN, name="demo", kind="pilot", status="awaiting_decision",
                 approvers=["alice", "carol"], two_person=True, submitter="bob")
    text = to_text(views.decision_message(run, []))
    assert "Who may approve (--by): alice, carol (approvals.approvers); two_person: not bob, " \
           "who submitted it" in text
    nobody = to_text(views.decision_message(run_of(id=RUN, name="demo", kind="pilot",
                                                   status="awaiting_decision"), []))
    assert "Nobody may approve: approvals.approvers lists no one" in nobody
