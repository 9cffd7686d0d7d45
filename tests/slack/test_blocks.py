"""Block Kit rendering stays inside Slack's limits; intake parsing undoes Slack's escaping."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.messages.model import (
    Actions,
    Attachment,
    Button,
    Fields,
    Heading,
    Message,
    StageLine,
    Table,
    Text,
)
from bot.slack.blocks import MAX_BLOCKS, render
from bot.slack.intake import clean, extract_manifest, parse_decision
from tests.slack.emulator import SlackApiError, _check_blocks


def test_big_table_is_summarised_within_limits() -> None:
    rows = tuple((f"doc-{i:05d}", "accepted", "invoice") for i in range(5000))
    msg = Message("r1", "balance", (Heading("Balance"), Table(("id", "status", "cat"), rows[:40],
                                                               5000),
                                    Attachment("/tmp/balance.csv", "balance.csv")))
    out = render(msg)
    _check_blocks(out.blocks, 50)
    text = out.blocks[1]["text"]["text"]
    assert len(text) <= 3000 and "of 5000 rows shown" in text
    assert [a.title for a in out.attachments] == ["balance.csv"]


def test_too_many_blocks_are_cut_to_fifty_with_a_note() -> None:
    msg = Message("r1", "verdict", tuple(Text(f"check {i}") for i in range(120)))
    out = render(msg)
    assert len(out.blocks) == MAX_BLOCKS
    assert "71 more block(s) left out" in str(out.blocks[-2])
    _check_blocks(out.blocks, 50)


def test_escaping_and_buttons() -> None:
    msg = Message("r1", "decision", (Text("a <b> & c"), Fields((("k", "<@U1>"),)),
                                     Actions((Button("approve", "Approve", "r1", "primary"),
                                              Button("revise", "Revise", "r1")))),
                  summary="x & y")
    out = render(msg)
    assert out.blocks[0]["text"]["text"] == "a &lt;b&gt; &amp; c"
    assert out.text == "x &amp; y"
    buttons = out.blocks[2]["elements"]
    assert buttons[0]["style"] == "primary" and "style" not in buttons[1]
    assert buttons[0]["action_id"] == "preflight_approve" and buttons[0]["value"] == "r1"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.builds(Heading, st.text(max_size=400)),
    st.builds(Text, st.text(max_size=5000)),
    st.builds(StageLine, st.text(min_size=1, max_size=30), st.sampled_from(
        ["pending", "running", "passed", "failed", "skipped"]), st.text(max_size=4000)),
    st.builds(Fields, st.lists(st.tuples(st.text(max_size=50), st.text(max_size=3000)),
                               max_size=25).map(tuple)),
    st.builds(Table, st.just(("a", "b")), st.lists(st.tuples(st.text(max_size=200),
                                                             st.text(max_size=200)),
                                                   max_size=60).map(tuple)),
), max_size=80))
def test_any_message_renders_to_blocks_slack_accepts(blocks: list[object]) -> None:
    out = render(Message("r", "status", tuple(blocks), summary="s"))  # type: ignore[arg-type]
    try:
        _check_blocks(out.blocks, 50)
    except SlackApiError as exc:  # pragma: no cover - the failure message is the point
        raise AssertionError(f"Slack would refuse: {exc.error}: {out.blocks}") from exc


def test_manifest_extraction_undoes_slack_formatting() -> None:
    text = ("<@U1> run this\n```yaml\nname: a &amp; b\nurl: <http://x.org/a|x.org/a>\n"
            "mail: <mailto:me@x.org|me@x.org>\nv: \"&gt;=3.9\"\n```")
    assert extract_manifest(text) == ("name: a & b\nurl: http://x.org/a\nmail: me@x.org\n"
                                      "v: \">=3.9\"\n")
    assert extract_manifest("no code here") is None
    assert clean("&lt;b&gt; &amp;amp;") == "<b> &amp;"


def test_decision_parsing() -> None:
    d = parse_decision("<@UBOT> approve balance &amp; sample reviewed")
    assert d is not None and (d.decision, d.reason) == ("approve", "balance & sample reviewed")
    assert parse_decision("<@UBOT> fix_env driver").decision == "fix-env"  # type: ignore[union-attr]
    assert parse_decision("<@UBOT> please approve") is None
