"""Bolt listeners: acknowledge at once, then hand over to ``Handlers`` (thin on purpose)."""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from slack_bolt import Ack, App
from slack_sdk import WebClient

from bot.errors import PreflightError
from bot.messages.targets import spend_lines
from bot.pilot.leases import STATES as LEASE_STATES
from bot.slack.blocks import escape
from bot.slack.handlers import Handlers
from bot.slack.intake import clean, extract_manifest, parse_decision, strip_mentions
from bot.slack.surfaces import (
    DECIDE_CALLBACK,
    HELP,
    MANIFEST_BLOCK,
    MANIFEST_FILE_BLOCK,
    REASON_BLOCK,
    SUBMIT_CALLBACK,
    decide_modal,
    runs_blocks,
    status_blocks,
    submit_modal,
)

log = logging.getLogger(__name__)
ACTION = re.compile(r"^preflight_(approve|fix-env|revise|stop)$")


def register(app: App, h: Handlers) -> None:
    app.event("app_mention")(_on_mention(h))
    app.event("message")(lambda: None)  # plain channel messages: nothing to do
    app.event("app_home_opened")(_on_home(h))
    app.command("/preflight")(_on_command(h))
    app.view(SUBMIT_CALLBACK)(_on_submit_view(h))
    app.action(ACTION)(_on_button(h))
    app.view(DECIDE_CALLBACK)(_on_decide_view(h))


def first_delivery(h: Handlers, body: dict[str, Any]) -> bool:
    """Slack retries (and may replay) an event with the same id: act on each id once.

    Claimed on the worker thread, after bolt has acknowledged: the SQLite write stays off
    the acknowledgement path, and the unique key makes concurrent deliveries harmless.
    """
    event_id = body.get("event_id")
    return not isinstance(event_id, str) or h.service.records.claim_event(event_id)


def _on_mention(h: Handlers) -> Callable[..., None]:
    def on_mention(event: dict[str, Any], body: dict[str, Any]) -> None:
        if event.get("bot_id") or event.get("subtype") == "bot_message":
            return
        if not first_delivery(h, body):
            return
        channel, user, ts = event["channel"], str(event.get("user") or ""), event["ts"]
        thread_ts = event.get("thread_ts")
        if not h.allowed(channel):
            h.refuse_channel(channel, user, thread_ts or ts)
            return
        try:
            _mention(h, event, channel, user, thread_ts or ts, bool(thread_ts))
        except PreflightError as exc:
            h.post(channel, thread_ts or ts, f":x: {escape(str(exc))}")
        except Exception:
            h.failed(channel, thread_ts or ts, "your message")
    return on_mention


def _mention(h: Handlers, event: dict[str, Any], channel: str, user: str, thread: str,
             in_thread: bool) -> None:
    text = str(event.get("text") or "")
    decision = parse_decision(text)
    if decision is not None:
        run_id = h.service.records.run_for_thread(channel, thread) if in_thread else None
        if run_id is None:
            h.ephemeral(channel, user, thread, "Type decisions in the thread of the pilot "
                        "they are about (or use its buttons).")
            return
        h.decide(run_id, decision.decision, decision.reason, user=user, channel=channel,
                 thread_ts=thread)
        return
    manifest = extract_manifest(text)
    source = "message"
    if manifest is None and event.get("files"):
        found = h.manifest_from_files(list(event["files"]))
        if found is not None:
            manifest, source = found
    if manifest is None:
        words = clean(strip_mentions(text)).lower()
        reply = HELP if words in ("", "help") else (
            "I did not find a manifest: put it in a code block (```yaml … ```) or attach a "
            "`.yaml` / `.json` file to the mention.\n\n" + HELP)
        h.post(channel, thread, reply)
        return
    h.submit(manifest, source=source, user=user, channel=channel, thread_ts=thread)


def _on_home(h: Handlers) -> Callable[..., None]:
    def on_home(event: dict[str, Any]) -> None:
        if event.get("tab", "home") == "home":
            h.publish_home(str(event["user"]))
    return on_home


def _on_command(h: Handlers) -> Callable[..., None]:
    def on_command(ack: Ack, command: dict[str, Any], client: WebClient) -> None:
        channel, user = command.get("channel_id", ""), command.get("user_id", "")
        if not h.allowed(channel):
            ack(text="Sorry, Preflight only runs in its own channels here; please use one of them.")
            return
        words = str(command.get("text") or "").split()
        verb, args = (words[0].lower(), words[1:]) if words else ("help", [])
        if verb == "submit":
            ack()
            client.views_open(trigger_id=command["trigger_id"],
                              view=submit_modal(channel, command.get("response_url")))
        elif verb == "run" and args:
            _run_named(h, ack, args[0], channel, user, command.get("response_url"))
        elif verb == "status":
            _status(h, ack, args, channel)
        elif verb == "stop":
            _stop(h, ack, args, channel, user)
        elif verb == "runs":
            ack(text="Recent runs", blocks=runs_blocks(h.service.records.records(20,
                                                                             channel=channel)))
        elif verb == "lease":
            ack(text=_lease(h, args, user, channel))
        else:
            ack(text=HELP)
    return on_command


def _run_named(h: Handlers, ack: Ack, name: str, channel: str, user: str,
               response_url: str | None) -> None:
    path = h.manifest_path(name)
    if path is None:
        ack(text=f"No manifest `{escape(name)}` on the bot host (looked for "
                 f"{escape(name)}.yaml, .yml and .json in the bot's manifests folder). "
                 "`/preflight runs` lists past runs.")
        return
    ack(text=f"Starting `{escape(name)}`: follow it in the thread I am opening.")
    root = h.post(channel, None, f"<@{user}> started the pilot `{escape(name)}` "
                  f"(manifests/{escape(path.name)})")
    if root is None:
        h.cannot_post(channel, response_url)
        return
    try:
        text = path.read_text(encoding="utf-8")
        h.submit(text, source=str(path), user=user, channel=channel, thread_ts=root)
    except (OSError, UnicodeDecodeError) as exc:
        h.post(channel, root, f":x: cannot read {escape(path.name)}: {escape(str(exc))}")
    except Exception:
        h.failed(channel, root, f"the pilot {name}")


LEASE_USAGE = ("Usage: `/preflight lease` (list) · `/preflight lease NODE` · "
               "`/preflight lease NODE STATE [note…]` with STATE one of "
               + ", ".join(LEASE_STATES))


def _lease(h: Handlers, args: list[str], user: str, channel: str) -> str:
    """The lease commands, recorded with the Slack user as who (changes: the policy's
    lease operators only; a refusal is answered privately and said in the channel)."""
    from bot.errors import PolicyRefused

    try:
        if not args:
            rows = h.service.records.leases(include_ended=False)
            return "\n".join(f"• `{escape(str(r['node']))}`: {r['state']}" for r in rows) \
                or "No open lease. " + LEASE_USAGE
        if len(args) == 1:
            lease = h.service.records.lease_of(args[0])
            return (f"`{escape(args[0])}` has no lease. " + LEASE_USAGE) if lease is None \
                else f"`{escape(args[0])}`: {lease['state']}"
        lease = h.service.records.change_lease(args[0], args[1], user, origin="slack",
                                       note=" ".join(args[2:]) or None)
        return f"Lease of `{escape(args[0])}` is now *{lease['state']}* (recorded, by <@{user}>)."
    except PolicyRefused as exc:
        h.post(channel, None, f":no_entry: <@{user}> tried to move the lease of "
               f"`{escape(args[0])}` to {escape(args[1])}: refused by the bot's policy "
               f"({', '.join(sorted({f'`{r.rule}`' for r in exc.refusals}))}).")
        return ":no_entry: Refused by the bot's policy (recorded; the lease did not move):\n" \
            + "\n".join(f"• {escape(str(r))}" for r in exc.refusals)
    except PreflightError as exc:
        return escape(str(exc))


def _stop(h: Handlers, ack: Ack, args: list[str], channel: str, user: str) -> None:
    if len(args) < 2:
        ack(text="Usage: `/preflight stop RUN reason…` (the reason is recorded)")
        return
    try:
        run_id = h.service.records.find_record(args[0]).id
    except PreflightError as exc:
        ack(text=escape(str(exc)))
        return
    if not h.may_act(run_id, "stop", user=user, channel=channel, thread_ts=None):
        ack(text=":no_entry: Refused by the bot's policy (recorded; nothing was stopped).")
        return
    ack(text=f"Stopping `{escape(run_id)}`…")
    h.stop(run_id, " ".join(args[1:]), user=user, channel=channel, thread_ts=None)


def _status(h: Handlers, ack: Ack, args: list[str], channel: str) -> None:
    """A run of this channel (a run of another channel is not shown: not found here)."""
    try:
        if args:
            run = h.service.records.find_record(args[0], channel=channel)
            ack(text="Run status", blocks=status_blocks(run, h.service.records.stages(run.id)))
            return
        runs = h.service.records.records(10, channel=channel)
        ack(text="Recent runs", blocks=runs_blocks(runs))
    except PreflightError as exc:
        ack(text=escape(str(exc)))


def _on_submit_view(h: Handlers) -> Callable[..., None]:
    def on_submit(ack: Ack, body: dict[str, Any], view: dict[str, Any]) -> None:
        values = view.get("state", {}).get("values", {})
        text = (values.get(MANIFEST_BLOCK, {}).get("value", {}).get("value") or "").strip()
        files = values.get(MANIFEST_FILE_BLOCK, {}).get("value", {}).get("files") or []
        if not text and not files:
            ack(response_action="errors",
                errors={MANIFEST_BLOCK: "Paste a manifest here or attach a file below."})
            return
        ack()
        meta = json.loads(view.get("private_metadata") or "{}")
        channel, user = str(meta.get("channel") or ""), str(body["user"]["id"])
        root = h.post(channel, None, f"<@{user}> submitted a pilot manifest")
        if root is None:
            h.cannot_post(channel, meta.get("response_url"))
            return
        try:
            source = "form"
            if not text:
                found = h.manifest_from_files(list(files))
                if found is None:
                    h.post(channel, root, ":x: the attached file is not .yaml, .yml or .json")
                    return
                text, source = found
            h.submit(text + "\n", source=source, user=user, channel=channel, thread_ts=root)
        except PreflightError as exc:
            h.post(channel, root, f":x: {escape(str(exc))}")
        except Exception:
            h.failed(channel, root, "the submitted manifest")
    return on_submit


def _on_button(h: Handlers) -> Callable[..., None]:
    def on_button(ack: Ack, body: dict[str, Any], action: dict[str, Any],
                  client: WebClient) -> None:
        ack()
        decision = ACTION.match(action["action_id"]).group(1)  # type: ignore[union-attr]
        run_id, user = str(action.get("value")), str(body["user"]["id"])
        channel = str((body.get("channel") or {}).get("id") or "")
        thread_ts = (body.get("message") or {}).get("thread_ts")
        ok, why = (h.running(run_id, channel, thread_ts) if decision == "stop"
                   else h.awaiting(run_id, channel, thread_ts))
        if not ok:
            h.ephemeral(channel, user, thread_ts, f":information_source: {escape(why)}")
            return
        if not h.may_act(run_id, decision, user=user, channel=channel, thread_ts=thread_ts):
            return
        forecast = h.service.follower.refresh_forecast(run_id) if decision == "approve" else None
        spend = spend_lines(h.service.records.record(run_id)) if decision == "approve" else None
        client.views_open(trigger_id=body["trigger_id"],
                          view=decide_modal(run_id, decision, channel, thread_ts, forecast,
                                            spend))
    return on_button


def _on_decide_view(h: Handlers) -> Callable[..., None]:
    def on_decide(ack: Ack, body: dict[str, Any], view: dict[str, Any]) -> None:
        values = view.get("state", {}).get("values", {})
        reason = (values.get(REASON_BLOCK, {}).get("value", {}).get("value") or "").strip()
        if not reason:
            ack(response_action="errors", errors={REASON_BLOCK: "A reason is required."})
            return
        ack()
        meta = json.loads(view.get("private_metadata") or "{}")
        channel = str(meta.get("channel") or "")
        try:
            act = h.stop if meta.get("decision") == "stop" else functools.partial(
                h.decide, decision=str(meta["decision"]))
            act(str(meta["run"]), reason=reason, user=str(body["user"]["id"]), channel=channel,
                thread_ts=meta.get("thread_ts"))
        except Exception:
            h.failed(channel, meta.get("thread_ts"), f"the decision on {meta.get('run')}")
    return on_decide
