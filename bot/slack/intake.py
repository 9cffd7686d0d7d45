"""What a user sent, turned into manifest text or a decision: pure parsing plus downloads.

Slack escapes ``&``, ``<`` and ``>`` in message text and wraps what looks like a link in
``<url|label>``; both are undone before the YAML parser sees the text.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bot.errors import PreflightError
from bot.slack.blocks import unescape

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
MAX_MANIFEST_BYTES = 1024 * 1024
DECISION_WORDS = {"approve": "approve", "fix-env": "fix-env", "fix_env": "fix-env",
                  "fixenv": "fix-env", "revise": "revise"}

_MENTION = re.compile(r"<@[A-Z0-9]+(?:\|[^>]*)?>")
_LINK = re.compile(r"<((?:https?|mailto|ftp):[^|>]+)(?:\|([^>]*))?>")
_FENCE = re.compile(r"```(.*?)```", re.DOTALL)
_LANG = re.compile(r"^[ \t]*(yaml|yml|json)[ \t]*\n", re.IGNORECASE)


class IntakeError(PreflightError):
    """What the user sent cannot be turned into a manifest (names what and why)."""


@dataclass(frozen=True)
class Decision:
    decision: str
    reason: str


def strip_mentions(text: str) -> str:
    return _MENTION.sub("", text).strip()


def clean(text: str) -> str:
    """Slack's formatting undone: links back to their target, entities unescaped."""
    def link(m: re.Match[str]) -> str:
        target, label = m.group(1), m.group(2)
        if target.startswith("mailto:"):
            return label or target[len("mailto:"):]
        return label if label and label == target else target

    return unescape(_LINK.sub(link, text))


def extract_manifest(text: str) -> str | None:
    """The manifest in the first code block of a message, ready for the parser."""
    match = _FENCE.search(text)
    if match is None:
        return None
    body = _LANG.sub("", match.group(1), count=1)
    body = clean(body).strip("\n")
    return body + "\n" if body.strip() else None


def parse_decision(text: str) -> Decision | None:
    """``approve <reason>``, ``fix-env <reason>``, ``revise <reason>`` (mentions removed)."""
    words = clean(strip_mentions(text)).split(None, 1)
    if not words:
        return None
    decision = DECISION_WORDS.get(words[0].lower())
    if decision is None:
        return None
    return Decision(decision, words[1].strip() if len(words) > 1 else "")


def manifest_files(files: list[dict[str, object]]) -> list[dict[str, object]]:
    return [f for f in files if str(f.get("name", "")).lower().endswith(MANIFEST_SUFFIXES)]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is never followed: urllib would send the bot token on to wherever it
    points (another host, plain http)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        host = urlsplit(newurl).hostname or newurl
        fp.close()  # the answer is not read: its connection goes
        raise IntakeError(f"Slack answered the file download with a redirect (HTTP {code}) "
                          f"to {host[:100]!r}: it is not followed, so the bot token goes "
                          "nowhere else; download the file again or paste the manifest")


def download_allowed(url: str, api_url: str) -> bool:
    """Whether the bot token may go to ``url``: https on Slack's own hosts, or exactly the
    API endpoint the bot is configured with (its scheme, host and port: a Slack emulator,
    a proxy the operator set)."""
    target, api = urlsplit(url), urlsplit(api_url or "https://slack.com/api/")
    host = (target.hostname or "").lower()
    if target.scheme == "https" and (host == "slack.com" or host.endswith(".slack.com")):
        return True
    return bool(host) and (target.scheme, host, target.port) == (
        api.scheme, (api.hostname or "").lower(), api.port)


def download(url: str, token: str, api_url: str) -> str:
    """A private Slack file, fetched with the bot token: only over https from Slack's own
    hosts (or the configured API endpoint), never following a redirect."""
    if not download_allowed(url, api_url):
        host = urlsplit(url).hostname
        raise IntakeError(f"refusing to send the bot token to {(host or url)[:100]!r} "
                          f"({urlsplit(url).scheme or 'no scheme'}): files are only fetched "
                          "over https from Slack")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(request, timeout=20) as resp:  # noqa: S310 (checked host)
            data: bytes = resp.read(MAX_MANIFEST_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise IntakeError(f"could not download the file (HTTP {exc.code}): is the bot a "
                          "member of the channel and does it have files:read?") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise IntakeError(f"could not download the file: {exc}") from exc
    if len(data) > MAX_MANIFEST_BYTES:
        raise IntakeError(f"the file is larger than {MAX_MANIFEST_BYTES // 1024} KiB: "
                          "a manifest is a few KiB of YAML or JSON")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IntakeError(f"the file is not UTF-8 text (byte {exc.start})") from exc
