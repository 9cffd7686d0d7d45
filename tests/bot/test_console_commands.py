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
