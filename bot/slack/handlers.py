"""What each Slack action does, as plain methods: submit, decide, answer, refuse.

Listeners (bot/slack/listeners.py) acknowledge first and then call these on bolt's worker
threads. Expected failures (``PreflightError``) are shown to the user; anything else is
logged with its traceback and the user gets a short line naming the run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.webhook import WebhookClient

from bot.errors import (
    DecisionRefused,
    ManifestError,
    PolicyRefused,
    PreflightError,
    ProjectCheckError,
)
from bot.pilot.states import OPEN, S
from bot.service import PilotService
from bot.settings import Settings
from bot.slack.blocks import escape
from bot.slack.followers import Followers
from bot.slack.intake import IntakeError, download, manifest_files
from bot.slack.surfaces import home_view, problems_blocks

log = logging.getLogger(__name__)

class Handlers:
    def __init__(self, settings: Settings, service: PilotService, client: WebClient,
                 followers: Followers) -> None:
        self.settings = settings
        self.service = service
        self.client = client
        self.followers = followers
        # the token goes to Slack's hosts over https, or to this configured endpoint only
        self.api_url = settings.slack_api_url or "https://slack.com/api/"

    # -- where we serve -----------------------------------------------------------
    def allowed(self, channel: str | None) -> bool:
        return not self.settings.channels or (channel or "") in self.settings.channels

    def refuse_channel(self, channel: str, user: str, thread_ts: str | None) -> None:
        self.ephemeral(channel, user, thread_ts,
                       "Sorry, Preflight only runs pilots in its own channels here. "
                       "Please post the manifest in one of them (ask whoever runs the bot).")

    # -- intake -------------------------------------------------------------------
    def manifest_from_files(self, files: list[dict[str, Any]]) -> tuple[str, str] | None:
        """(text, file name) of the first manifest file shared, downloaded with the token."""
        wanted = manifest_files(files)
        if not wanted:
            return None
        info = wanted[0]
        url = str(info.get("url_private_download") or info.get("url_private") or "")
        if not url:
            resp = self.client.files_info(file=str(info["id"]))
            url = str(resp["file"].get("url_private_download") or resp["file"]["url_private"])
        token = self.client.token or ""
        return download(url, token, self.api_url), str(info.get("name"))

    def submit(self, text: str, *, source: str, user: str, channel: str,
               thread_ts: str) -> str | None:
        """Validate, plan, start and follow; every failure is answered in the thread."""
        try:
            loaded = self.service.load(text, source=source, base_dir=self._base_dir(),
                                       user=user, origin="slack", channel=channel)
            sub = self.service.submit(loaded, submitter=user, channel=channel,
                                      thread_ts=thread_ts, origin="slack")
        except PolicyRefused as exc:
            self.refused(exc, user=user, channel=channel, thread_ts=thread_ts)
            return None
        except ManifestError as exc:
            self.post(channel, thread_ts, f"The manifest is not valid ({len(exc.problems)} "
                      "problem(s))", problems_blocks(f"{exc.source}: the manifest is not valid",
                                                     exc.problems))
            return None
        except ProjectCheckError as exc:
            self.post(channel, thread_ts, "The project check failed",
                      problems_blocks("The project check failed", exc.problems))
            return None
        except PreflightError as exc:
            self.post(channel, thread_ts, f":x: {escape(str(exc))}")
            return None
        try:
            self.service.starter.start(sub.run_id)
        except PreflightError as exc:
            log.warning("run %s could not start: %s", sub.run_id, exc)
            self.tell_not_started(sub.run_id, channel, thread_ts, exc)
            return sub.run_id
        self.followers.follow(sub.run_id)
        return sub.run_id

    def tell_not_started(self, run_id: str, channel: str, thread_ts: str | None,
                         exc: PreflightError) -> None:
        """A start refused before the runner was tried (a lease, a missing dispatcher) is
        said in the thread; a failed dispatch (``dispatch_failed``) the service posted."""
        try:
            status: str | None = self.service.records.head(run_id).status
        except PreflightError:
            status = None
        if status == S.DISPATCH_FAILED:
            return
        self.post(channel, thread_ts, f":x: Run `{run_id}` was not started: {escape(str(exc))}")

    # -- decisions ----------------------------------------------------------------
    def decide(self, run_id: str, decision: str, reason: str, *, user: str, channel: str,
               thread_ts: str | None) -> dict[str, Any] | None:
        why = self.not_here(run_id, channel, thread_ts)
        if why is not None:
            self.ephemeral(channel, user, thread_ts, f":x: {escape(why)}")
            return None
        try:
            record = self.service.decider.decide(run_id, decision, reason, user, source="slack",
                                         channel=channel)
        except PolicyRefused as exc:
            self.refused(exc, user=user, channel=channel, thread_ts=thread_ts)
            return None
        except DecisionRefused as exc:
            self.ephemeral(channel, user, thread_ts,
                           f":no_entry: Decision refused (and recorded): {escape(str(exc))}")
            return None
        except PreflightError as exc:
            if decision == "approve" and self.service.records.head(run_id).status == S.DECIDED:
                # Recorded, then the full-volume run could not start: the thread must know.
                self.post(channel, thread_ts, ":x: The decision is recorded, but the "
                          f"full-volume run was not started: {escape(str(exc))}")
            else:
                self.ephemeral(channel, user, thread_ts, f":x: {escape(str(exc))}")
            return None
        volume = record.get("volume_run")
        if volume:
            self.followers.follow(str(volume))
        return record

    def stop(self, run_id: str, reason: str, *, user: str, channel: str,
             thread_ts: str | None) -> None:
        """Stop a run from its thread (button + modal) or from `/preflight stop`."""
        why = self.not_here(run_id, channel, thread_ts) if thread_ts else None
        if why is not None:
            self.ephemeral(channel, user, thread_ts, f":x: {escape(why)}")
            return
        try:
            run = self.service.stop(run_id, by=user, reason=reason, wait=False,
                                    origin="slack", channel=channel)
        except PolicyRefused as exc:
            self.refused(exc, user=user, channel=channel, thread_ts=thread_ts)
            return
        except PreflightError as exc:
            self.ephemeral(channel, user, thread_ts, f":x: {escape(str(exc))}")
            return
        self.followers.follow(str(run["id"]))  # closes it as stopped once the runner ended
        if run.get("thread_ts"):
            self.post(str(run.get("channel") or channel), str(run["thread_ts"]),
                      f":octagonal_sign: <@{user}> stopped run `{escape(str(run['id']))}`: "
                      f"{escape(reason)}. `preflight resume {escape(str(run['id']))}` "
                      "continues from its ledger.")

    def not_here(self, run_id: str, channel: str, thread_ts: str | None) -> str | None:
        """Why a decision from this channel/thread cannot be about ``run_id``, or None.

        A button's value and a modal's metadata name a run: only an exact id of a run of
        this very channel (and thread, when known) counts, never a prefix of another one.
        """
        try:
            run = self.service.records.head(run_id)
        except PreflightError:
            return f"there is no run {run_id}"
        if run.channel != channel or (thread_ts and run.thread_ts not in (None, thread_ts)):
            return f"run {run_id} is not a pilot of this thread: decide in its own thread"
        return None

    def running(self, run_id: str, channel: str, thread_ts: str | None) -> tuple[bool, str]:
        """Whether the run can be stopped now, and if not, why (for an ephemeral)."""
        why = self.not_here(run_id, channel, thread_ts)
        if why is not None:
            return False, why
        status = self.service.records.head(run_id).status
        if status in (S.RUNNING, S.DISPATCHING):  # being started: the start is ended
            return True, ""
        return False, (f"run {run_id} is {status}: only a running run can be stopped, "
                       "or one being started")

    def may_act(self, run_id: str, action: str, *, user: str, channel: str,
                thread_ts: str | None) -> bool:
        """Whether ``user`` may press this run's ``action`` button here (the policy: the
        run's channel; stop, fix-env, revise need its submitter, an approver or an admin);
        a refusal is recorded and told like any other."""
        try:
            self.service.records.may_act(run_id, action, user, channel=channel)
        except PolicyRefused as exc:
            self.refused(exc, user=user, channel=channel, thread_ts=thread_ts)
            return False
        return True

    def awaiting(self, run_id: str, channel: str, thread_ts: str | None) -> tuple[bool, str]:
        """Whether a decision can be taken now, and if not, why (for an ephemeral)."""
        why = self.not_here(run_id, channel, thread_ts)
        if why is not None:
            return False, why
        try:
            refusal = self.service.decider.decision_refusal(run_id, who=lambda user: f"<@{user}>")
        except PreflightError as exc:
            return False, str(exc)
        return refusal is None, refusal or ""

    def refused(self, exc: PolicyRefused, *, user: str, channel: str,
                thread_ts: str | None) -> None:
        """A policy refusal: the details privately to the user, one line in the thread."""
        lines = "\n".join(f"• {escape(str(r))}" for r in exc.refusals)
        self.ephemeral(channel, user, thread_ts, f":no_entry: Refused by the bot's policy "
                       f"(recorded; nothing was run, read or changed):\n{lines}")
        rules = ", ".join(sorted({f"`{r.rule}`" for r in exc.refusals}))
        self.post(channel, thread_ts, f":no_entry: <@{user}>'s {exc.action} was refused by the "
                  f"bot's policy ({rules}); the details went to them privately.")

    # -- the App Home tab ---------------------------------------------------------
    def publish_home(self, user: str) -> None:
        runs = self.service.records.records_for(user, limit=100)
        active = [r for r in runs if r.status in OPEN]
        decisions = self.service.records.decisions_for(user, limit=20)
        self.client.views_publish(user_id=user, view=home_view(active, decisions))

    # -- replies ------------------------------------------------------------------
    def post(self, channel: str, thread_ts: str | None, text: str,
             blocks: list[dict[str, Any]] | None = None) -> str | None:
        try:
            resp = self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text,
                                                blocks=blocks)
        except (SlackApiError, SlackClientError) as exc:
            log.warning("reply in %s failed: %s", channel, exc)
            return None
        return str(resp["ts"])

    def ephemeral(self, channel: str, user: str, thread_ts: str | None, text: str) -> None:
        try:
            self.client.chat_postEphemeral(channel=channel, user=user, thread_ts=thread_ts,
                                           text=text)
        except (SlackApiError, SlackClientError) as exc:
            log.warning("ephemeral reply to %s failed: %s", user, exc)

    def tell(self, response_url: str | None, text: str) -> None:
        """A private answer through a command's response_url (works where the bot cannot post)."""
        if not response_url:
            log.warning("nowhere to tell the user: %s", text)
            return
        try:
            WebhookClient(response_url, timeout=10).send(text=text, response_type="ephemeral")
        except (SlackClientError, OSError) as exc:
            log.warning("answering through the response_url failed: %s", exc)

    def cannot_post(self, channel: str, response_url: str | None) -> None:
        self.tell(response_url, f":x: I cannot post in <#{channel}>, so nothing was started: "
                  "invite me first (`/invite @preflight`), or use a channel I am in.")

    def failed(self, channel: str, thread_ts: str | None, what: str) -> None:
        """An unexpected error: logged with its traceback, a short line for the user."""
        log.exception("%s failed", what)
        self.post(channel, thread_ts, f":warning: Something went wrong while handling {what}; "
                  "it is logged on the bot host.")

    def _base_dir(self) -> Path:
        return self.settings.manifests_dir or self.settings.home

    def manifest_path(self, name: str) -> Path | None:
        base = self._base_dir()
        if not name or any(c in name for c in "/\\") or name.startswith("."):
            return None
        for suffix in (".yaml", ".yml", ".json"):
            path = base / f"{name}{suffix}"
            if path.is_file():
                return path
        return None


__all__ = ["Handlers", "IntakeError"]
