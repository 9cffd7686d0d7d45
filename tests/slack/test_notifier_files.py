"""What the bot uploads to Slack: only regular files inside the run's directory, and
never a credential (docs/security.md, "What comes back from a node")."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bot.messages.model import Attachment, Message, Text
from bot.slack.app import make_client
from bot.slack.notifier import SlackNotifier
from bot.store import Store
from tests.slack.conftest import CHANNEL, make_settings
from tests.slack.emulator import SlackEmulator

CANARY = "CANARY-the-bot-users-private-key"


def setup(tmp_path: Path, emulator: SlackEmulator) -> tuple[SlackNotifier, Path, Path]:
    store = Store(tmp_path / "db.sqlite")
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    store.create_run({"id": "r1", "name": "n", "attempt": 1, "run_dir": str(run_dir),
                      "channel": CHANNEL,
                      "thread_ts": emulator.user_message(CHANNEL, "root", "U1")})
    secret = tmp_path / "bot-home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text(CANARY + "\n", encoding="utf-8")
    return SlackNotifier(make_client(make_settings(tmp_path, emulator)), store), run_dir, secret


def publish(notifier: SlackNotifier, *files: Attachment) -> None:
    notifier.publish(Message("r1", "balance", (Text("balance"), *files), summary="balance"))
    assert notifier.flush(30)


def uploaded(emulator: SlackEmulator) -> dict[str, bytes]:
    return {f["name"]: f["content"] for f in emulator.files.values()}


def test_a_link_a_fifo_or_a_file_outside_the_run_directory_is_never_uploaded(
        tmp_path: Path, emulator: SlackEmulator) -> None:
    notifier, run_dir, secret = setup(tmp_path, emulator)
    (run_dir / "d").mkdir()
    (run_dir / "d" / "leak").symlink_to(secret)
    (run_dir / "balance.csv").symlink_to("d/leak")  # a link to a link to the key
    (run_dir / "up").symlink_to(tmp_path / "bot-home")  # a folder link out of the run dir
    os.mkfifo(run_dir / "pipe")
    publish(notifier,
            Attachment(str(run_dir / "balance.csv"), "balance.csv"),
            Attachment(str(run_dir / "up" / ".ssh" / "id_ed25519"), "key.txt"),
            Attachment(str(secret), "outside.txt"),
            Attachment(str(run_dir / "pipe"), "pipe.csv"))
    notifier.close()
    assert uploaded(emulator) == {}
    sent = json.dumps([c.params for c in emulator.calls])
    assert CANARY not in sent and "files.getUploadURLExternal" not in sent


def test_an_uploaded_file_has_its_secrets_redacted_and_a_plain_one_goes_as_it_is(
        tmp_path: Path, emulator: SlackEmulator) -> None:
    notifier, run_dir, _ = setup(tmp_path, emulator)
    token = "xoxb-1234567890-abcdefghijkl"
    aws = "AKIAABCDEFGHIJKLMNOP"
    (run_dir / "balance.csv").write_text(f"id,status\ndoc-01,accepted {token}\n"
                                         f"doc-02,refused {aws}\n", encoding="utf-8")
    (run_dir / "plain.csv").write_text("id,status\ndoc-01,accepted\n", encoding="utf-8")
    (run_dir / "blob.bin").write_bytes(b"\xff\xfe\x00" + aws.encode() + b"\x80")
    publish(notifier, Attachment(str(run_dir / "balance.csv"), "balance.csv"),
            Attachment(str(run_dir / "plain.csv"), "plain.csv"),
            Attachment(str(run_dir / "blob.bin"), "blob.bin"))
    notifier.close()
    files = uploaded(emulator)
    assert set(files) == {"balance.csv", "plain.csv"}  # a binary file with a key: refused
    text = files["balance.csv"].decode("utf-8")
    assert token not in text and aws not in text
    assert "doc-01,accepted [redacted: a Slack token]" in text
    assert "[redacted: an AWS access key id]" in text
    assert files["plain.csv"] == b"id,status\ndoc-01,accepted\n"


def test_a_big_balance_goes_gzipped_and_a_file_too_big_is_named_in_the_thread(
        tmp_path: Path, emulator: SlackEmulator) -> None:
    """balance.csv over GZIP_OVER is uploaded as balance.csv.gz (the same rows, redacted);
    a file over the upload limit is not attached and one thread message says which, its
    size, the limit and where it lies on the bot host; said once, not on every update."""
    import gzip

    from bot.slack.notifier import GZIP_OVER, MAX_UPLOAD_BYTES

    notifier, run_dir, _ = setup(tmp_path, emulator)
    token = "xoxb-1234567890-abcdefghijkl"
    rows = [f"doc-{i:06d},accepted,invoice\n" for i in range(GZIP_OVER // 20)]
    text = "id,status,category\n" + "".join(rows) + f"doc-x,refused {token}\n"
    (run_dir / "balance.csv").write_text(text, encoding="utf-8")
    (run_dir / "small.csv").write_text("id,status\ndoc-01,accepted\n", encoding="utf-8")
    with (run_dir / "report.html").open("wb") as fh:  # sparse: nothing is written
        fh.truncate(MAX_UPLOAD_BYTES + (5 << 20))
    files = (Attachment(str(run_dir / "balance.csv"), "balance.csv"),
             Attachment(str(run_dir / "small.csv"), "small.csv"),
             Attachment(str(run_dir / "report.html"), "report.html"))
    publish(notifier, *files)
    notifier.publish(Message("r1", "balance", (Text("balance, again"), *files),
                             summary="balance"))
    assert notifier.flush(30)
    notifier.close()
    got = uploaded(emulator)
    assert set(got) == {"balance.csv.gz", "small.csv"}
    unpacked = gzip.decompress(got["balance.csv.gz"]).decode("utf-8")
    assert len(got["balance.csv.gz"]) < len(text) // 5
    assert unpacked.startswith("id,status,category\ndoc-000000,accepted,invoice\n")
    assert unpacked.count("\n") == text.count("\n") and token not in unpacked
    assert got["small.csv"] == b"id,status\ndoc-01,accepted\n"  # small: as it is
    notes = [m.text for m in emulator.messages.values() if "not attached" in m.text]
    assert notes == [f":warning: report.html is not attached: 69.0 MiB, over the 64.0 MiB "
                     f"the bot uploads. It lies on the bot host at {run_dir / 'report.html'}."]
    assert all(m.thread_ts == notifier.store.run_record("r1").thread_ts
               for m in emulator.messages.values() if "not attached" in m.text)
