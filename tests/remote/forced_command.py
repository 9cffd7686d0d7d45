"""A node whose team rewrote its SSH answers: the program a ``command="…"`` prefix in
``~/.ssh/authorized_keys`` runs instead of every session (the tests' attacker).

``python3 forced_command.py RENAMES.json``. sshd puts what the client asked for in
``SSH_ORIGINAL_COMMAND``: the SFTP subsystem (the sftp-server's path) or a command. A
command is run as asked (``sh -c``), the results fetch's program too, whose tar stream is
rewritten the same way (a member whose first name is in RENAMES is renamed); the SFTP
subsystem runs the real sftp-server behind
this program, which rewrites every ``SSH_FXP_NAME`` reply as an attacker would: a listed
name found in RENAMES (``{"names": {"balance.csv": "../../victim.txt"}}``) is answered as
its replacement. Standard library only: the node's interpreter runs it.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tarfile
import threading
from typing import BinaryIO

FXP_NAME = 104
FETCH_MARK = "PREFLIGHT.held"  # in the fetch program's text (bot/node_programs)


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _string(buf: bytes, at: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from(">I", buf, at)
    return buf[at + 4:at + 4 + n], at + 4 + n


def _attrs_end(buf: bytes, at: int) -> int:
    """Where the SFTP v3 ATTRS starting at ``at`` end."""
    (flags,) = struct.unpack_from(">I", buf, at)
    at += 4
    at += 8 if flags & 0x1 else 0  # size
    at += 8 if flags & 0x2 else 0  # uid, gid
    at += 4 if flags & 0x4 else 0  # permissions
    at += 8 if flags & 0x8 else 0  # atime, mtime
    if flags & 0x80000000:
        (count,) = struct.unpack_from(">I", buf, at)
        at += 4
        for _ in range(2 * count):
            _, at = _string(buf, at)
    return at


def rewrite_names(packet: bytes, names: dict[str, str]) -> bytes:
    """An ``SSH_FXP_NAME`` packet body (type byte first) with the listed names replaced."""
    req_id, count = struct.unpack_from(">II", packet, 1)
    out, at = [packet[:9]], 9
    for _ in range(count):
        name, at = _string(packet, at)
        longname, at = _string(packet, at)
        end = _attrs_end(packet, at)
        new = names.get(name.decode("utf-8", "surrogateescape"))
        name = new.encode() if new is not None else name
        out += [struct.pack(">I", len(name)), name, struct.pack(">I", len(longname)),
                longname, packet[at:end]]
        at = end
    return b"".join(out)


def sftp_proxy(server: str, names: dict[str, str]) -> int:
    proc = subprocess.Popen([server], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    child_in, child_out = proc.stdin, proc.stdout

    def requests() -> None:  # the client's requests, passed on as they are
        stdin = sys.stdin.buffer
        while True:
            chunk = stdin.read1(65536)
            if not chunk:
                break
            child_in.write(chunk)
            child_in.flush()
        child_in.close()

    threading.Thread(target=requests, daemon=True).start()
    out = sys.stdout.buffer
    try:
        while True:
            (length,) = struct.unpack(">I", _read_exact(child_out, 4))
            body = _read_exact(child_out, length)
            if body[0] == FXP_NAME:
                body = rewrite_names(body, names)
            out.write(struct.pack(">I", len(body)) + body)
            out.flush()
    except EOFError:
        pass
    return proc.wait()


def tar_proxy(asked: str, names: dict[str, str]) -> int:
    """The fetch program's stream, each member whose first name is listed renamed."""
    proc = subprocess.Popen(["/bin/sh", "-c", asked], stdout=subprocess.PIPE)
    src = tarfile.open(fileobj=proc.stdout, mode="r|")
    dst = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT)
    for member in src:
        head, sep, rest = member.name.partition("/")
        if head in names:
            member.name = names[head] + sep + rest
        dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    dst.close()
    return proc.wait()


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        plan = json.load(fh)
    asked = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    if asked.endswith("sftp-server"):
        return sftp_proxy(asked, plan.get("names") or {})
    if not asked:
        return 1
    if FETCH_MARK in asked:
        return tar_proxy(asked, plan.get("names") or {})
    os.execv("/bin/sh", ["sh", "-c", asked])
    return 1  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
