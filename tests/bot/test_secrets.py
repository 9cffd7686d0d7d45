"""Credentials are refused wherever they hide; references to them are fine."""

from __future__ import annotations

import pytest

from bot.manifest.secrets import HOW_TO, find_secrets, find_secrets_in_text, is_secret_key

SECRETS = [
    "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp",
    "xoxp-1234-5678-abcdef",
    "xapp-1-A0123-4567-abcdef",
    "AKIAIOSFODNN7EXAMPLE",
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "postgres://admin:s3cret@db.internal:5432/x",
    "ghp_" + "a" * 36,
    "https://hooks.slack.com/services/T000/B000/XXXX",
    "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh",
    "sk-proj-" + "Ab1_" * 10,
]


@pytest.mark.parametrize("value", SECRETS)
def test_secret_values_found_deep_with_their_path(value: str) -> None:
    data = {"task": {"params": {"steps": [1, {"note": f"use {value} here"}]}}}
    [finding] = find_secrets(data)
    assert finding.path == ("task", "params", "steps", 1, "note")
    assert HOW_TO in finding.message


@pytest.mark.parametrize("key", ["password", "passwd", "DB_PASSWORD", "apiKey", "api_key",
                                 "access-token", "client_secret", "token", "hfToken",
                                 "ssh_passphrase"])
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)
    assert find_secrets({key: "value"})[0].path == (key,)
    assert find_secrets({key: 12345}) != []


@pytest.mark.parametrize("data", [
    {"password": "${DB_PASSWORD}"}, {"token": "env:SLACK_TOKEN"}, {"password": ""},
    {"password": None}, {"max_tokens": 512}, {"tokenizer": "bpe"},
    {"host_key_fingerprint": "SHA256:abc"}, {"url": "https://example.net/a@b"},
    {"text": "xox is not a token"}, {"secret": {"nested": "plain"}},
    {"pad_token": "<pad>"}, {"eos_token": "</s>"}, {"bosToken": "<s>"},
    {"model": "hf_internal_testing/tiny-random-gpt2"}, {"library": "sk-learn"},
])
def test_not_secrets(data: dict[str, object]) -> None:
    assert find_secrets(data) == []


def test_recursive_structures_are_safe() -> None:
    loop: list[object] = []
    loop.append(loop)
    assert find_secrets({"a": loop}) == []


def test_text_lines() -> None:
    text = "torch==2.1\n--extra-index-url https://u:p@pypi.example.net/simple\n"
    assert find_secrets_in_text(text) == [(2, "a URL with a user and password")]


def test_wandb_keys_and_bearer_jwts_are_found_but_a_commit_is_not() -> None:
    from bot.manifest.secrets import classify_value, find_secrets

    key = "0123456789abcdef0123456789abcdef01234567"
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P"
    found = find_secrets({"params": {"wandb_key": key, "revision": key,
                                     "headers": [f"Authorization: Bearer {jwt}"]}})
    assert {f.path for f in found} == {("params", "wandb_key"), ("params", "headers", 0)}
    assert classify_value(f"WANDB_API_KEY={key}") == "a Weights & Biases API key"
    assert classify_value(jwt) == "a JSON Web Token"
    assert classify_value(f"pinned at commit {key}") is None
