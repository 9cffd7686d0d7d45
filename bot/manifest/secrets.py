"""Refuse credentials in manifests and parameter files.

A manifest is posted in a chat thread, stored in SQLite and copied with the evidence, so a
token in it leaks three times. Anything that looks like a credential is refused with the
field path and a note on how to give access separately.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Path = tuple[str | int, ...]

HOW_TO = ("never put credentials in a manifest or a parameter file: give access separately "
          "(an environment variable on the bot host, the ssh agent, or the bot host's config)")

_VALUE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a Slack token", re.compile(r"\bxox[abpres]-[A-Za-z0-9-]{6,}")),
    ("a Slack app token", re.compile(r"\bxapp-[A-Za-z0-9-]{6,}")),
    ("a Slack webhook URL", re.compile(r"hooks\.slack\.com/services/[A-Za-z0-9/]+")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{20,})")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("an API secret key (sk-...)", re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{32,}")),
    ("a PEM block (key material)", re.compile(r"-----BEGIN [A-Z0-9 ]+-----")),
    ("a URL with a user and password", re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
    ("a bearer token", re.compile(r"\bBearer\s+[A-Za-z0-9._~+/-]{20,}=*", re.IGNORECASE)),
    ("a JSON Web Token",
     re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+")),
    ("a Weights & Biases API key",
     re.compile(r"(?i)\b(?:wandb|wb)[\w-]{0,20}\s*[:=]\s*['\"]?[0-9a-f]{40}\b")),
)
# A bare 40-hex value is a git commit as often as a W&B key: a credential under a key that
# says wandb (``wandb_key: 0123…``), a commit elsewhere.
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_WANDB_KEY = re.compile(r"(?i)wandb|^wb_|_wb$|^wb$")

_SECRET_KEYS = frozenset({"password", "passwd", "pwd", "passphrase", "secret", "token",
                          "api_key", "apikey", "access_key", "secret_key", "private_key",
                          "auth_token"})
_SECRET_SUFFIXES = ("_password", "_passwd", "_passphrase", "_secret", "_token", "_api_key",
                    "_apikey", "_secret_key", "_private_key")
# Tokenizer settings (``pad_token: "<pad>"``) are model parameters, not credentials.
_TOKENIZER_KEY = re.compile(r"^(?:pad|eos|bos|unk|cls|sep|mask|sos|start|end|image|audio|"
                            r"video|special|system|user|assistant)_token$")
# A value that only names where the secret lives (``${DB_PASSWORD}``, ``env:DB_PASSWORD``)
# is the recommended way, not a leak.
_REFERENCE = re.compile(r"^(?:\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|env:[A-Za-z_][A-Za-z0-9_]*)$")


@dataclass(frozen=True)
class SecretFinding:
    path: Path
    what: str

    @property
    def message(self) -> str:
        return f"looks like {self.what}; {HOW_TO}"


def is_secret_key(key: str) -> bool:
    """True for keys such as ``password``, ``db_password``, ``apiKey``, ``access-token``."""
    norm = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower().replace("-", "_")
    if _TOKENIZER_KEY.match(norm):
        return False
    return norm in _SECRET_KEYS or norm.endswith(_SECRET_SUFFIXES)


def classify_value(value: str) -> str | None:
    """What secret ``value`` looks like, or None."""
    for what, pattern in _VALUE_PATTERNS:
        if pattern.search(value):
            return what
    return None


def find_secrets(data: Any, path: Path = ()) -> list[SecretFinding]:
    """Every credential-looking value or secret-named key with a value, by field path.

    Safe on shared or recursive structures (YAML aliases): each container is visited once.
    """
    return list(_walk(data, path, set()))


def _walk(data: Any, path: Path, seen: set[int]) -> Iterator[SecretFinding]:
    if isinstance(data, (dict, list)):
        if id(data) in seen:
            return
        seen.add(id(data))
    if isinstance(data, dict):
        for key, value in data.items():
            sub = (*path, str(key))
            if isinstance(key, str) and is_secret_key(key) and _has_value(value):
                yield SecretFinding(sub, f"a credential (key {key!r} with a value)")
                continue
            if isinstance(key, str) and _WANDB_KEY.search(key) and isinstance(value, str) \
                    and _HEX40.match(value.strip()):
                yield SecretFinding(sub, "a Weights & Biases API key (40 hex characters)")
                continue
            yield from _walk(value, sub, seen)
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _walk(value, (*path, index), seen)
    elif isinstance(data, str):
        what = classify_value(data)
        if what is not None:
            yield SecretFinding(path, what)


def _has_value(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return False
    if isinstance(value, str):
        return bool(value.strip()) and not _REFERENCE.match(value.strip())
    if isinstance(value, (dict, list)):
        return False  # a section named "secret" is walked, its leaves are checked
    return True


def find_secrets_in_text(text: str) -> list[tuple[int, str]]:
    """(line number, what) for each line of free text that holds a credential-looking value."""
    found: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        what = classify_value(line)
        if what is not None:
            found.append((lineno, what))
    return found


_PEM_BLOCK = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|\Z)", re.DOTALL)


def redact_secrets(text: str) -> str:
    """``text`` with every credential-looking value replaced by ``[redacted: what]``.

    The last line of defence for what the bot posts; key material is cut whole, from its
    BEGIN line to its END line (or the end of the text).
    """
    text = _PEM_BLOCK.sub("[redacted: key material]", text)
    for what, pattern in _VALUE_PATTERNS:
        text = pattern.sub(f"[redacted: {what}]", text)
    return text
