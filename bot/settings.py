"""One frozen Settings object, built from the environment at the entry point.

Nothing else in the code base reads ``os.environ``: everything below the entry point is
given a Settings (or the piece of it that it needs).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

_N = TypeVar("_N", int, float)


@dataclass(frozen=True)
class Settings:
    home: Path
    db_path: Path
    jobs_db_path: Path
    runs_dir: Path
    python: str
    slack_bot_token: str | None = None
    slack_app_token: str | None = None
    slack_signing_secret: str | None = None
    slack_api_url: str | None = None
    channels: frozenset[str] = field(default_factory=frozenset)
    approvers: frozenset[str] = field(default_factory=frozenset)
    manifests_dir: Path | None = None
    user: str = "unknown"
    # Where ``user`` came from: "PREFLIGHT_USER", "USER" or "LOGNAME"; "" when none was set.
    user_from: str = ""
    ssh_known_hosts: Path | None = None
    ssh_client_keys: tuple[Path, ...] = ()
    ssh_config: Path | None = None
    # How long a follower keeps trying to reach an unreachable node before it gives up.
    contact_give_up_s: float = 600.0
    policy_path: Path | None = None  # PREFLIGHT_POLICY; None: $PREFLIGHT_HOME/policy.yaml if any
    # The environment a local runner inherits: the entry point's, minus every Slack secret.
    runner_env: tuple[tuple[str, str], ...] = ()
    # Whether db_path named an existing state database (found, not about to be created).
    state_found: bool = True
    # `preflight serve --http`: the address it listens on (behind the team's proxy) and the
    # largest request body it reads before the signature check.
    http_host: str = "127.0.0.1"
    http_max_body: int = 1024 * 1024
    # The most a results fetch brings back from a node: in all, and for one file (bytes),
    # and files in all (bot/nodes/ssh/fetch_staging.py: FetchLimits).
    fetch_max_bytes: int = 4 << 30
    fetch_max_file_bytes: int = 2 << 30
    fetch_max_files: int = 200_000
    # A copy to or from a node fails once it moved no byte for this long, and otherwise
    # runs up to a ceiling of its fixed part plus its bytes at this floor rate (bytes/s).
    transfer_stall_s: float = 120.0
    transfer_floor_bytes_per_s: int = 1 << 20
    # How long an ended run keeps its item rows, expected ids and progress in the state
    # database (days; 0: for ever). bot/store/retention.py says what is pruned and why.
    retention_days: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *,
                 python: str | None = None) -> Settings:
        import sys

        env = os.environ if env is None else env
        home = (Path(env["PREFLIGHT_HOME"]).resolve() if env.get("PREFLIGHT_HOME")
                else find_home(_cwd()))
        state = home / "state"
        db_path = Path(env.get("PREFLIGHT_DB") or state / "preflight.db")
        return cls(
            home=home,
            db_path=db_path,
            state_found=db_path.is_file(),
            jobs_db_path=Path(env.get("PREFLIGHT_JOBS_DB") or state / "jobs.db"),
            runs_dir=Path(env.get("PREFLIGHT_RUNS_DIR") or home / "runs"),
            python=env.get("PREFLIGHT_RUNNER_PYTHON") or python or sys.executable,
            slack_bot_token=env.get("SLACK_BOT_TOKEN") or None,
            slack_app_token=env.get("SLACK_APP_TOKEN") or None,
            slack_signing_secret=env.get("SLACK_SIGNING_SECRET") or None,
            slack_api_url=env.get("SLACK_API_URL") or None,
            channels=_csv(env.get("PREFLIGHT_CHANNELS")),
            approvers=_csv(env.get("PREFLIGHT_APPROVERS")),
            manifests_dir=Path(env.get("PREFLIGHT_MANIFESTS_DIR") or home / "manifests"),
            user=env.get("PREFLIGHT_USER") or env.get("USER") or env.get("LOGNAME") or "unknown",
            user_from=next((k for k in ("PREFLIGHT_USER", "USER", "LOGNAME") if env.get(k)), ""),
            ssh_known_hosts=_path(env.get("PREFLIGHT_SSH_KNOWN_HOSTS")),
            ssh_client_keys=tuple(Path(p) for p in _csv(env.get("PREFLIGHT_SSH_KEYS"))),
            ssh_config=_path(env.get("PREFLIGHT_SSH_CONFIG")),
            contact_give_up_s=_seconds(env, "PREFLIGHT_SSH_GIVE_UP_S", 600.0),
            policy_path=_path(env.get("PREFLIGHT_POLICY")),
            fetch_max_bytes=_bytes(env, "PREFLIGHT_FETCH_MAX_BYTES", 4 << 30),
            fetch_max_file_bytes=_bytes(env, "PREFLIGHT_FETCH_MAX_FILE_BYTES", 2 << 30),
            fetch_max_files=_positive(env, "PREFLIGHT_FETCH_MAX_FILES", 200_000, int,
                                      "whole number of files"),
            transfer_stall_s=_seconds(env, "PREFLIGHT_TRANSFER_STALL_S", 120.0),
            transfer_floor_bytes_per_s=_bytes(env, "PREFLIGHT_TRANSFER_FLOOR_BYTES_PER_S",
                                              1 << 20),
            runner_env=tuple(sorted((k, v) for k, v in env.items() if not k.startswith("SLACK_"))),
            http_host=env.get("PREFLIGHT_HTTP_HOST") or "127.0.0.1",
            http_max_body=_bytes(env, "PREFLIGHT_HTTP_MAX_BODY", 1024 * 1024),
            retention_days=_days(env, "PREFLIGHT_RETENTION_DAYS", 30.0),
        )

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def _cwd() -> Path:
    try:
        return Path(os.getcwd()).resolve()
    except OSError as exc:
        from bot.errors import PreflightError

        raise PreflightError(f"the current directory is unusable ({exc.strerror}): "
                             "cd into the project, or set PREFLIGHT_HOME") from exc


def find_home(start: Path) -> Path:
    """The project whose runs these are: the nearest folder, from ``start`` up, that holds
    ``state/preflight.db`` (as git finds ``.git``); ``start`` itself when none does."""
    for folder in (start, *start.parents):
        if (folder / "state" / "preflight.db").is_file():
            return folder
    return start


def _path(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None


def _csv(value: str | None) -> frozenset[str]:
    return frozenset(v.strip() for v in (value or "").split(",") if v.strip())


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds; an unusable value is one clear error, not a traceback."""
    return _positive(env, name, default, float, "number of seconds")


def _bytes(env: Mapping[str, str], name: str, default: int) -> int:
    """A positive whole number of bytes; an unusable value is one clear error."""
    return _positive(env, name, default, int, "whole number of bytes")


def _days(env: Mapping[str, str], name: str, default: float) -> float:
    """A number of days, 0 or more (0: for ever); an unusable value is one clear error."""
    raw = env.get(name)
    unit = "number of days, 0 (keep for ever) or more"
    if raw is not None and raw.strip() in ("0", "0.0"):
        return 0.0
    days = _positive(env, name, default, float, unit)
    if days > 36500:  # inf, or more than a timedelta can hold
        from bot.errors import PreflightError

        raise PreflightError(f"{name}={raw!r}: expected a {unit} (at most 36500; 0 keeps "
                             "for ever)")
    return days


def _positive(env: Mapping[str, str], name: str, default: _N, parse: Callable[[str], _N],
              unit: str) -> _N:
    """``env[name]`` read by ``parse`` (``float``, ``int``), which must come out above zero
    (NaN does not); ``default`` when unset or empty. Anything else is one PreflightError
    naming the variable, its value and the ``unit`` expected."""
    raw = env.get(name)
    if not raw:
        return default
    try:
        value: _N | None = parse(raw)
    except ValueError:
        value = None
    if value is None or not value > 0:
        from bot.errors import PreflightError

        raise PreflightError(f"{name}={raw!r}: expected a positive {unit}")
    return value
