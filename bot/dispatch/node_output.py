"""What a node's command prints, read with a cap: never held whole in the bot's memory.

A command's standard output and error (a probe, the card proof, ``ray start``, the
launcher's answer, a corpus listing) are written by the node, and once a team's code has
run there, by the team: a project whose ``torch`` prints gigabytes must not take the bot
down for every team. Each stream is read in chunks as it arrives; past its cap
(``NODE_OUTPUT_CAP``, 4 MiB, unless the caller sizes it) the bot stops reading, closes
the channel and raises ``NodeOutputTooLarge`` naming the node, the command and the cap.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bot.errors import DispatchError

MIB = 1 << 20
NODE_OUTPUT_CAP = 4 * MIB
CHUNK = 64 * 1024


class NodeOutputTooLarge(DispatchError):
    """A node's command printed more than the bot reads of it."""


def too_large(where: str, what: str, stream: str, cap: int) -> NodeOutputTooLarge:
    return NodeOutputTooLarge(
        f"{where}: {what} printed more than {cap // MIB} MiB on its standard {stream} (the "
        f"cap on what the bot reads of a node's command, {cap} bytes): the bot stopped "
        "reading and closed the channel. Something on the node (the project's own modules "
        "come first on its path) writes far more than the runner does: find what prints it")


async def read_capped(stream: Any, cap: int) -> bytes | None:
    """The whole of ``stream`` (bytes), or None once it passed ``cap`` (what was read is
    dropped: the caller closes the channel)."""
    data = bytearray()
    while True:
        chunk = await stream.read(CHUNK)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > cap:
            return None


async def read_lines(stream: Any, take: Any, cap: int = NODE_OUTPUT_CAP) -> bytes | None:
    """Lines of ``stream`` handed to ``take(line: str) -> bool`` until it returns True;
    then what came after that line (b"" from an honest node: it prints nothing more until
    told), or None once a line passed ``cap`` bytes. Raises ``EOFError`` when the stream
    ends first. Never holds more than one line and one chunk."""
    buf = bytearray()
    while True:
        end = buf.find(b"\n")
        if end < 0:
            if len(buf) > cap:
                return None
            chunk = await stream.read(CHUNK)
            if not chunk:
                raise EOFError("the output ended")
            buf += chunk
            continue
        line = bytes(buf[:end])
        del buf[:end + 1]
        if len(line) > cap:
            return None
        if take(line.decode("utf-8", errors="replace")):
            return bytes(buf)


async def run_capped(conn: Any, command: str, *, where: str, stdin: str | bytes = "",
                     cap: int = NODE_OUTPUT_CAP) -> tuple[int | None, str, str]:
    """``command`` on ``conn``, ``stdin`` (text or bytes) fed to it: (exit status, None
    when its connection dropped; stdout; stderr as text), each stream read up to ``cap``
    bytes, ``NodeOutputTooLarge`` past it (both streams read at once: a command that fills
    one while the other is awaited would wait for ever)."""
    proc = await conn.create_process(command, encoding=None)
    try:
        if stdin:
            proc.stdin.write(stdin.encode() if isinstance(stdin, str) else stdin)
        proc.stdin.write_eof()
        out, err = await _both(proc, cap, where, command)
    except BaseException:
        proc.close()
        raise
    await proc.wait()
    return (proc.exit_status, out.decode("utf-8", errors="replace"),
            err.decode("utf-8", errors="replace"))


async def _both(proc: Any, cap: int, where: str, command: str) -> tuple[bytes, bytes]:
    tasks = [asyncio.ensure_future(read_capped(proc.stdout, cap)),
             asyncio.ensure_future(read_capped(proc.stderr, cap))]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.result() is None:
                    stream = "output" if task is tasks[0] else "error"
                    raise too_large(where, f"`{command[:80]}`", stream, cap)
    finally:
        for task in tasks:
            task.cancel()
    out, err = (t.result() for t in tasks)
    assert out is not None and err is not None
    return out, err
