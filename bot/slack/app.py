"""The Slack bot assembled: Web API client, notifier, followers, the bolt App, listeners."""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slack_bolt import App
from slack_sdk import WebClient
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
)
from slack_sdk.web import SlackResponse

from bot.errors import PreflightError
from bot.manifest.secrets import redact_secrets
from bot.service import PilotService
from bot.settings import Settings
from bot.slack.directory import SlackDirectory
from bot.slack.followers import Followers
from bot.slack.handlers import Handlers
from bot.slack.listeners import register
from bot.slack.notifier import MessageRefs, SlackNotifier

DEFAULT_API_URL = "https://slack.com/api/"
_TOKEN = re.compile(r"xox[abposr]-[A-Za-z0-9-]+|xapp-[A-Za-z0-9-]+")


class RedactTokens(logging.Filter):
    """Tokens never reach a log line, whoever logs them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _TOKEN.search(message):
            record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:  # a traceback is formatted from this
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def redact(text: str) -> str:
    return _TOKEN.sub("xox…(redacted)", text)


class _ClientGiven(logging.Filter):
    """bolt reads SLACK_BOT_TOKEN itself and warns that our ready-made client wins: it does."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`token` will be unused" not in record.getMessage()


_CLIENT_GIVEN = _ClientGiven()


class ScrubbingWebClient(WebClient):
    """Every string the bot sends through the Web API passes the secret scanner first.

    The last line of defence, not the only one (the policy keeps a Slack manifest from
    reading outside its project roots): a credential-looking value becomes
    ``[redacted: what]`` whichever message, modal or ephemeral carries it.
    """

    def api_call(self, api_method: str, *, http_verb: str = "POST",
                 files: dict[str, Any] | None = None, data: dict[str, Any] | None = None,
                 params: dict[str, Any] | None = None, json: dict[str, Any] | None = None,
                 headers: dict[str, Any] | None = None,
                 auth: dict[str, Any] | None = None) -> SlackResponse:
        return super().api_call(api_method, http_verb=http_verb, files=files, data=scrub(data),
                                params=scrub(params), json=scrub(json), headers=headers,
                                auth=auth)


def scrub(value: Any) -> Any:
    """``value`` with secrets redacted from every string in it (``token`` fields kept)."""
    if isinstance(value, str):
        return redact_secrets(value)
    if isinstance(value, dict):
        return {k: v if k == "token" else scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def make_client(settings: Settings, *, rate_limit_retries: int = 5) -> WebClient:
    """A Web API client that honours 429 Retry-After, retries dropped connections and
    never sends a credential-looking string (``ScrubbingWebClient``)."""
    base = settings.slack_api_url or DEFAULT_API_URL
    return ScrubbingWebClient(token=settings.slack_bot_token, base_url=base.rstrip("/") + "/",
                     timeout=30, retry_handlers=[
                         ConnectionErrorRetryHandler(max_retry_count=2),
                         RateLimitErrorRetryHandler(max_retry_count=rate_limit_retries)])


class SlackTransport:
    """What Slack hands the service it is built with (``bot.compose.make_service``): its
    notifier, made on the service's store (``notifier``, a factory: the notifier keeps its
    message references there) and its directory of user groups (``directory``)."""

    def __init__(self, settings: Settings, *, client: WebClient | None = None,
                 min_interval: float = 1.0) -> None:
        self.client = client or make_client(settings)
        self.directory = SlackDirectory(self.client)
        self.min_interval = min_interval
        self._notifier: SlackNotifier | None = None

    def notifier(self, refs: MessageRefs) -> SlackNotifier:
        """The Slack notifier on ``refs`` (made once: the service and the bot share it)."""
        if self._notifier is None:
            self._notifier = SlackNotifier(self.client, refs, min_interval=self.min_interval)
        return self._notifier

    @property
    def made_notifier(self) -> SlackNotifier:
        if self._notifier is None:
            raise PreflightError("the Slack transport's notifier was never given to a "
                                 "service: build the service with transport.notifier")
        return self._notifier


class SlackBot:
    """One running bot, on a service built with its transport's notifier and directory:

        transport = SlackTransport(settings)
        service = make_service(settings, transport.notifier, directory=transport.directory)
        bot = SlackBot(settings, service, transport)
    """

    def __init__(self, settings: Settings, service: PilotService, transport: SlackTransport,
                 *, socket_mode: bool = False, token_verification: bool = True,
                 workers: int = 8) -> None:
        self.settings = settings
        self.service = service
        self.client = transport.client
        self.notifier = transport.made_notifier
        self.followers = Followers(service)
        bolt_log = logging.getLogger("bot.slack.bolt")
        bolt_log.addFilter(_CLIENT_GIVEN)  # the same object: added once however many bots
        self.app = App(client=self.client, signing_secret=settings.slack_signing_secret or "",
                       request_verification_enabled=not socket_mode,
                       token_verification_enabled=token_verification,
                       listener_executor=ThreadPoolExecutor(max_workers=workers,
                                                            thread_name_prefix="slack-listener"),
                       logger=bolt_log)
        self.handlers = Handlers(settings, service, self.client, self.followers)
        register(self.app, self.handlers)

    def resume(self) -> list[str]:
        """Pick up the runs a previous bot was following (continues from the stored seq)."""
        return self.followers.resume_active()

    def close(self, timeout: float = 30.0) -> None:
        self.followers.stop(timeout)
        self.notifier.close(timeout)


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    target = logger or logging.getLogger()
    for handler in target.handlers:
        handler.addFilter(RedactTokens())
    target.addFilter(RedactTokens())


def describe_token_problem(settings: Settings, *, http: bool) -> str | None:
    """Every token that is missing or malformed, one per line; None when they look right."""
    problems = []
    token = settings.slack_bot_token
    if not token:
        problems.append("SLACK_BOT_TOKEN is not set: copy the Bot User OAuth Token (xoxb-…) "
                        "of the app")
    elif not token.startswith("xoxb-"):
        problems.append("SLACK_BOT_TOKEN must be a bot token starting with xoxb-")
    if http and not settings.slack_signing_secret:
        problems.append("SLACK_SIGNING_SECRET is not set: HTTP mode verifies every request "
                        "with it")
    app_token = settings.slack_app_token
    if not http and not app_token:
        problems.append("SLACK_APP_TOKEN is not set: set it (xapp-…) for Socket Mode, or run "
                        "`preflight serve --http --port N` behind a public URL")
    elif not http and app_token is not None and not app_token.startswith("xapp-"):
        problems.append("SLACK_APP_TOKEN must be an app-level token starting with xapp-")
    return "\n".join(problems) or None


def bolt_problem(exc: Any) -> str:
    """A bolt start-up error (auth.test refused) as one line without the token."""
    text = redact(str(exc))
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"Slack refused SLACK_BOT_TOKEN ({first})"
