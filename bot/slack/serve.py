"""`preflight serve`: the Slack bot, in Socket Mode or over HTTP (Events API)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import typer

from bot.settings import Settings


def register(app: typer.Typer) -> None:
    app.command()(serve)


def serve(
    http: bool = typer.Option(False, "--http", help="serve the Events API over HTTP instead of "
                              "Socket Mode (needs SLACK_SIGNING_SECRET)"),
    port: int = typer.Option(3000, "--port", help="HTTP port (0: any free port)"),
    host: str = typer.Option("", "--host", help="HTTP address to listen on (default: "
                             "PREFLIGHT_HTTP_HOST, else 127.0.0.1 behind the team's proxy)"),
) -> None:
    """Run the Slack bot: Socket Mode (needs SLACK_APP_TOKEN), or --http for the Events API."""
    from slack_sdk.errors import SlackApiError, SlackClientError

    from bot.errors import PolicyError
    from bot.policy import policy_for
    from bot.slack.app import describe_token_problem, install_log_redaction, make_client

    settings = Settings.from_env()
    try:
        policy = policy_for(settings)  # a broken policy file: the bot does not start
    except PolicyError as exc:
        _die(f"{exc}\nfix the policy file (docs/security.md lists every key) and start again")
    for warning in policy.warnings:  # e.g. a role held through an editable user group
        typer.echo(f"warning: {warning}", err=True)
    problem = describe_token_problem(settings, http=http)  # every missing token at once
    if problem:
        _die(problem)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    quiet = logging.getLogger("slack_sdk")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the one line below says it all
    try:
        who = make_client(settings).auth_test()
    except SlackApiError as exc:
        _die(f"Slack refused SLACK_BOT_TOKEN ({exc.response.get('error', 'unknown error')}): "
             "copy the Bot User OAuth Token again from the app's OAuth & Permissions page")
    except (SlackClientError, OSError) as exc:
        _die(f"cannot reach the Slack Web API at {settings.slack_api_url or 'slack.com'}: {exc}")
    finally:
        quiet.setLevel(level)
    _run(settings, http=http, host=host or settings.http_host, port=port,
         bot_user=str(who.get("user_id")), policy=policy)


def _run(settings: Settings, *, http: bool, host: str, port: int, bot_user: str,
         policy: Any) -> None:
    from bot.compose import make_service
    from bot.slack.app import SlackBot, SlackTransport, install_log_redaction
    from bot.slack.server import HttpServer

    transport = SlackTransport(settings)
    service = make_service(settings, transport.notifier, policy=policy,
                           directory=transport.directory)
    said = (f"policy: {policy.path}" if policy.from_file else
            f"policy: built-in defaults (no file at {policy.path})")
    bot = SlackBot(settings, service, transport, socket_mode=not http,
                   token_verification=False)
    from bot.schedule import BotScheduler

    scheduler = BotScheduler(settings, service)  # watch, lease and evidence reminders
    scheduler.start()
    resumed = bot.resume()
    if resumed:
        typer.echo(f"following {len(resumed)} run(s) again: {', '.join(resumed)}")
    try:
        if http:
            try:
                server = HttpServer(bot.app, host, port, log_level="info",
                                    max_body=settings.http_max_body)
            except OSError as exc:
                _die(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
            for name in ("uvicorn", "uvicorn.access"):  # uvicorn's own handlers, set just now
                install_log_redaction(logging.getLogger(name))
            typer.echo(f"preflight bot {bot_user} listening on {server.url}", err=False)
            typer.echo(said)
            sys.stdout.flush()
            server.serve()
        else:
            _serve_socket_mode(bot.app, settings, bot_user, said)
    finally:
        scheduler.shutdown()
        bot.close()
        service.close()


def _serve_socket_mode(app: Any, settings: Settings, bot_user: str, said: str) -> None:
    """Connect with the app-level token (one clear line if Slack refuses it), then block."""
    import threading

    from slack_bolt.adapter.socket_mode import SocketModeHandler
    from slack_sdk.errors import SlackApiError, SlackClientError

    handler = SocketModeHandler(app, settings.slack_app_token)
    quiet = app.logger  # it logs a refused token on several lines: the one below says it all
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        handler.connect()  # type: ignore[no-untyped-call]
    except SlackApiError as exc:
        _die(f"Slack refused SLACK_APP_TOKEN ({exc.response.get('error', 'unknown error')}): "
             "generate an app-level token with connections:write (Basic Information → "
             "App-Level Tokens) and enable Socket Mode for the app")
    except (SlackClientError, OSError) as exc:
        _die(f"cannot open a Socket Mode connection: {exc}")
    finally:
        quiet.setLevel(level)
    typer.echo(f"preflight bot {bot_user} connected in Socket Mode")
    typer.echo(said)
    sys.stdout.flush()
    try:
        threading.Event().wait()  # the connection's own threads serve; this one waits
    finally:
        handler.close()  # type: ignore[no-untyped-call]


def _die(message: str) -> None:
    for line in message.splitlines():
        typer.echo(f"error: {line}", err=True)
    raise typer.Exit(2)
