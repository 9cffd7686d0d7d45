"""Acknowledgement latency of the Slack bot under load, against a bare bolt app.

1,000 signed Events API requests are posted on loopback to (a) a bare bolt App whose only
listener does nothing, and (b) the Preflight bot while a pilot streams its events and the
bot posts and edits its thread. Both run the same server (bolt's ASGI adapter under
uvicorn) against the same Web API emulator, in this invocation. Also prints how many Web
API calls the 12-document pilot costs. Target: p99 of (b) at most 1.2x (a).

The bot runs as a deployment would: with a policy file (``policy.yaml`` in its home) that
allows what the bench submits (the local node, its prices and its days).
``PREFLIGHT_BENCH_SMOKE=1``: 60 events on each side (a smoke run that checks the bench runs
to its verdict line, not the target).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slack_bolt import App  # noqa: E402
from slack_sdk.signature import SignatureVerifier  # noqa: E402

from bot.nodes.local import LocalDispatcher  # noqa: E402
from bot.policy import policy_for  # noqa: E402
from bot.service import PilotService  # noqa: E402
from bot.settings import Settings  # noqa: E402
from bot.slack.app import SlackBot, SlackTransport, make_client  # noqa: E402
from bot.slack.server import HttpServer  # noqa: E402
from bot.store import Store  # noqa: E402
from tests.slack.emulator import SlackEmulator  # noqa: E402
from tests.slack.fakes import ReplayDispatcher, make_project  # noqa: E402

TOKEN, SECRET, CHANNEL = "xoxb-bench", "bench-secret", "C0BENCH"
SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
EVENTS, CLIENTS, TARGET = 60 if SMOKE else 1000, 4, 1.2


def settings_for(root: Path, emu: SlackEmulator) -> Settings:
    return Settings(home=root, db_path=root / "state" / "db.sqlite", jobs_db_path=root / "j.db",
                    runs_dir=root / "runs", python=sys.executable, slack_bot_token=TOKEN,
                    slack_signing_secret=SECRET, slack_api_url=emu.api_url,
                    manifests_dir=root / "manifests")


# What the bench's pilots need, as a team running the bot on one machine would write it: the
# bot host as a node, the bench's own directory as the project root, its approver named.
POLICY = """\
roles:
  approvers: [U0APPROVER]
nodes: [local]
project_roots: [{root}]
"""


def write_policy(root: Path) -> None:
    """The bot's policy file in its home (``policy.yaml``), read at start (policy_for)."""
    (root / "policy.yaml").write_text(POLICY.format(root=root), encoding="utf-8")


def submitted(run_id: str | None, emu: SlackEmulator) -> str:
    """The run's id, or the bench stops with what the bot answered in the thread."""
    if run_id is None:
        said = [str(c.params.get("text")) for c in emu.calls_to("chat.postMessage")]
        raise SystemExit(f"the bot did not start the bench's pilot: {said[-1:]}")
    return run_id


def post(url: str, body: str) -> float:
    ts = str(int(time.time()))
    sig = SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)
    req = urllib.request.Request(url, data=body.encode(), method="POST", headers={
        "Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": sig})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
        assert resp.status == 200, resp.status
    return time.perf_counter() - start


def event_body(n: int, tag: str) -> str:
    """Nine channel messages in ten; every tenth a mention the bot answers in a thread."""
    ts = f"{int(time.time())}.{n:06d}"
    kind = "app_mention" if n % 10 == 0 else "message"
    return json.dumps({"type": "event_callback", "team_id": "T1", "api_app_id": "A1",
                       "event_id": f"Ev{tag}{n:07d}", "event_time": int(time.time()),
                       "event": {"type": kind, "channel": CHANNEL, "user": "U1",
                                 "ts": ts, "text": f"<@U0BOT> help {n}"}})


def blast(url: str, tag: str) -> list[float]:
    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(lambda n: post(url, event_body(n, tag)), range(EVENTS)))


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000


def bare(emu: SlackEmulator, root: Path) -> list[float]:
    app = App(client=make_client(settings_for(root, emu)), signing_secret=SECRET)
    app.event("message")(lambda: None)
    app.event("app_mention")(lambda: None)
    with HttpServer(app) as server:
        blast(server.url, "warm")
        return blast(server.url, "bare")


def loaded(emu: SlackEmulator, root: Path) -> tuple[list[float], int]:
    text = make_project(root, count=400)
    write_policy(root)
    settings = settings_for(root, emu)
    store = Store(settings.db_path)
    replay = ReplayDispatcher(pause_after=5, pace=0.01)
    transport = SlackTransport(settings)
    service = PilotService(settings, store, {"local": replay}, transport.notifier(store),
                           policy=policy_for(settings), directory=transport.directory)
    bot = SlackBot(settings, service, transport)
    with HttpServer(bot.app) as server:
        blast(server.url, "warm")
        root_ts = emu.user_message(CHANNEL, "bench", "U1")
        run_id = submitted(bot.handlers.submit(text, source="bench", user="U1", channel=CHANNEL,
                                               thread_ts=root_ts), emu)
        replay.release()  # the pilot streams while the events arrive
        latencies = blast(server.url, "bot")
        streaming = store.get_run(run_id)["status"] == "running"
    bot.close()
    return latencies, int(streaming)


def pilot_cost(root: Path) -> tuple[int, dict[str, int]]:
    """Web API calls of the 12-document pilot with the real runner, mention to buttons."""
    with SlackEmulator(tokens=(TOKEN,)) as emu:
        text = make_project(root, real_docs=True)
        write_policy(root)
        settings = settings_for(root, emu)
        local = LocalDispatcher(sys.executable, env=dict(Settings.from_env().runner_env))
        transport = SlackTransport(settings)
        store = Store(settings.db_path)
        service = PilotService(settings, store, {"local": local}, transport.notifier(store),
                               policy=policy_for(settings), directory=transport.directory)
        bot = SlackBot(settings, service, transport)
        thread = emu.user_message(CHANNEL, "pilot", "U1")
        run_id = submitted(bot.handlers.submit(text, source="bench", user="U1", channel=CHANNEL,
                                               thread_ts=thread), emu)
        bot.followers.wait(run_id, 90)
        bot.close()
        calls = [c.method for c in emu.calls if c.method != "auth.test"]
        return len(calls), dict(Counter(calls))


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        with SlackEmulator(tokens=(TOKEN,)) as emu:
            (base / "bare").mkdir()
            reference = bare(emu, base / "bare")
            (base / "bot").mkdir()
            ours, streaming = loaded(emu, base / "bot")
        (base / "cost").mkdir()
        calls, by_method = pilot_cost(base / "cost")
    ratio = pct(ours, 99) / pct(reference, 99)
    print(f"bare bolt app : p50 {pct(reference, 50):.2f} ms  p99 {pct(reference, 99):.2f} ms")
    print(f"preflight bot : p50 {pct(ours, 50):.2f} ms  p99 {pct(ours, 99):.2f} ms"
          f"  (pilot still streaming at the end: {'yes' if streaming else 'no'})")
    print(f"web API calls for the 12-document pilot (real runner): {calls} {by_method}")
    verdict = "PASS" if ratio <= TARGET else "MISS"
    print(f"ack_p99_ratio: {ratio:.2f} (target {TARGET:.1f}) {verdict}")


if __name__ == "__main__":
    main()
