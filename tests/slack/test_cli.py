"""`preflight serve` as a real process: clear errors on bad tokens, HTTP mode on port 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from slack_sdk.signature import SignatureVerifier

from tests.slack.conftest import SECRET, TOKEN
from tests.slack.emulator import SlackEmulator

REPO = Path(__file__).resolve().parents[2]


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "PREFLIGHT_"))}
    env.update(PREFLIGHT_HOME=str(tmp_path), PYTHONPATH=str(REPO), **extra)
    return env


def serve(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bot", "serve", *args], cwd=tmp_path,
                          env=env_for(tmp_path, **extra), capture_output=True, text=True,
                          timeout=60)


def test_missing_tokens_give_one_clear_line_each(tmp_path: Path) -> None:
    done = serve(tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, lines  # every missing token at once, not only the first
    assert "SLACK_BOT_TOKEN is not set" in lines[0] and "SLACK_APP_TOKEN is not set" in lines[1]
    done = serve(tmp_path, "--http")
    assert done.returncode == 2 and "SLACK_BOT_TOKEN is not set" in done.stderr
    assert "SLACK_SIGNING_SECRET is not set" in done.stderr
    done = serve(tmp_path, "--http", SLACK_BOT_TOKEN=TOKEN)
    assert done.returncode == 2 and "SLACK_SIGNING_SECRET" in done.stderr


def test_invalid_token_is_one_line_without_the_token(tmp_path: Path,
                                                     emulator: SlackEmulator) -> None:
    secret_token = "xoxb-1234-not-a-valid-token"
    done = serve(tmp_path, "--http", SLACK_BOT_TOKEN=secret_token, SLACK_SIGNING_SECRET=SECRET,
                 SLACK_API_URL=emulator.api_url)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        done.stderr.strip()] and "invalid_auth" in done.stderr
    assert secret_token not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_http_mode_serves_signed_requests(tmp_path: Path, emulator: SlackEmulator) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "bot", "serve", "--http", "--port", "0"],
                            cwd=tmp_path,  # no --host: loopback by default (behind a proxy)
                            env=env_for(tmp_path, SLACK_BOT_TOKEN=TOKEN,
                                        SLACK_SIGNING_SECRET=SECRET,
                                        SLACK_API_URL=emulator.api_url,
                                        PREFLIGHT_HTTP_MAX_BODY="1024"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, (line, proc.stderr and proc.stderr.read())
        big = urllib.request.Request(line.split("listening on ", 1)[1].strip(),
                                     data=b"x" * 2048, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:  # over the cap: not even parsed
            urllib.request.urlopen(big, timeout=30)
        refused.value.close()
        assert refused.value.code == 413
        url = line.split("listening on ", 1)[1].strip()
        body = json.dumps({"type": "url_verification", "challenge": "c-123", "token": "x"})
        ts = str(int(time.time()))
        sig = SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)
        request = urllib.request.Request(url, data=body.encode(), method="POST", headers={
            "Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": sig})
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 200 and json.loads(resp.read())["challenge"] == "c-123"
        health = url.replace("/slack/events", "/healthz")
        with urllib.request.urlopen(health, timeout=30) as resp:
            assert resp.read() == b"ok"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert TOKEN not in err
