"""The emulator rejects what Slack rejects, so the other tests can trust a green call."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from tests.slack.conftest import TOKEN
from tests.slack.emulator import SlackEmulator


def error_of(call: object) -> str:
    with pytest.raises(SlackApiError) as info:
        call()  # type: ignore[operator]
    return str(info.value.response["error"])


def test_rejections_like_slack(emulator: SlackEmulator) -> None:
    c = WebClient(token=TOKEN, base_url=emulator.api_url)
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "x"}}
    assert error_of(lambda: c.chat_postMessage(channel="C1", text="t", blocks=[section] * 51)) \
        == "invalid_blocks"
    long = {"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}
    assert error_of(lambda: c.chat_postMessage(channel="C1", text="t", blocks=[long])) \
        == "invalid_blocks"
    assert error_of(lambda: c.chat_postMessage(channel="C1", text="t",
                                               blocks=[{"type": "table"}])) == "invalid_blocks"
    assert error_of(lambda: c.chat_postMessage(channel="C1", text="x" * 40001)) == "msg_too_long"
    assert error_of(lambda: c.chat_update(channel="C1", ts="1.2", text="t")) == "message_not_found"
    ok = c.chat_postMessage(channel="C1", text="t", blocks=[section] * 50)
    thread = c.chat_postMessage(channel="C1", text="reply", thread_ts=ok["ts"])
    replies = c.conversations_replies(channel="C1", ts=ok["ts"])["messages"]
    assert [m["ts"] for m in replies] == [ok["ts"], thread["ts"]]
    assert c.users_info(user="U1")["user"]["id"] == "U1"
    assert len(emulator.calls_to("chat.postMessage")) == 2


def test_429_on_demand_and_files_behind_the_token(emulator: SlackEmulator) -> None:
    emulator.rate_limit(1, method="auth.test", retry_after=7)
    c = WebClient(token=TOKEN, base_url=emulator.api_url)  # no retry handler: sees the 429
    with pytest.raises(SlackApiError) as info:
        c.auth_test()
    assert info.value.response.status_code == 429
    assert info.value.response.headers["Retry-After"] == "7"
    shared = emulator.add_file("m.yaml", b"name: x\n")
    info_resp = c.files_info(file=shared["id"])
    url = info_resp["file"]["url_private_download"]
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(url, timeout=10)
    assert denied.value.code == 403
    denied.value.close()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.read() == b"name: x\n"


def test_token_types_edits_inputs_and_every_request_recorded() -> None:
    with SlackEmulator(tokens=(TOKEN,), app_tokens=("xapp-1-A1-1-x",)) as emu:
        bot = WebClient(token=TOKEN, base_url=emu.api_url)
        app = WebClient(token="xapp-1-A1-1-x", base_url=emu.api_url)
        assert error_of(lambda: bot.apps_connections_open(app_token=TOKEN)) \
            == "not_allowed_token_type"
        assert error_of(lambda: app.chat_postMessage(channel="C1", text="t")) \
            == "not_allowed_token_type"
        emu.socket_url = "ws://127.0.0.1:9/link"
        assert app.apps_connections_open(app_token="xapp-1-A1-1-x")["url"] == emu.socket_url
        theirs = emu.user_message("C1", "a person wrote this", "U1")
        assert error_of(lambda: bot.chat_update(channel="C1", ts=theirs, text="t")) \
            == "cant_update_message"
        label = {"type": "plain_text", "text": "Manifest"}
        for element in ({"type": "plain_text_input", "action_id": "v", "max_length": 3001},
                        {"type": "plain_text_input", "action_id": "v", "min_length": 10,
                         "max_length": 5},
                        {"type": "code_editor", "action_id": "v"}):
            view = {"type": "modal", "title": {"type": "plain_text", "text": "Submit"},
                    "blocks": [{"type": "input", "label": label, "element": element}]}
            assert error_of(lambda v=view: bot.views_open(trigger_id="t1", view=v)) \
                == "invalid_blocks", element
        view["blocks"] = [{"type": "input", "label": label, "element": {
            "type": "file_input", "action_id": "f", "max_files": 1}}]
        assert bot.views_open(trigger_id="t1", view=view)["ok"]
        bot.files_upload_v2(channel="C1", content="id,status\n", filename="b.csv")
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(emu.url + "/nowhere", timeout=10)
        missing.value.close()
        methods = [c.method for c in emu.calls]
        assert methods.count("apps.connections.open") == 2 and "file.upload" in methods
        assert "GET /nowhere" in methods and "files.completeUploadExternal" in methods
