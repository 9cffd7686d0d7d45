"""Runs on the node: a folder of a finished run written to stdout as one tar stream.

Run with the node's own interpreter (``python -S -c <this text> ROOT [SKIP...]``, Python
>= 3.9, standard library only). ``ROOT`` is the evidence copy of a run (or, for a run
without one, its run directory); ``SKIP`` the top-level names left out (the bot's own
records). Stdin: what the bot already holds from a cut try, one ``<sha256>  <path>`` line
each (``SHA256SUMS``' form), then end of file.

The stream (``tarfile``'s "w|", PAX) holds every entry under ``ROOT``, named relative to
it, ``SHA256SUMS`` first when there is one, then the rest in sorted order, folders before
what they hold. A file the bot holds with the digest ``ROOT``'s ``SHA256SUMS`` gives it
(or, without ``SHA256SUMS``, the digest of the node's file) is sent as an empty member
marked ``HELD`` (a PAX field holding that digest): the bot keeps its copy and knows the
file is still there, and its bytes do not cross again. Links are sent as links, FIFOs,
devices and sockets as members of their type (a socket: type ``SOCKET``), never
followed or read: the bot refuses them by name. Nothing is written on the node.
"""

import hashlib
import os
import stat
import sys
import tarfile
from typing import IO, Dict, List, Optional

HELD = "PREFLIGHT.held"  # a PAX field: the bot holds this file with this digest
SOCKET = b"s"  # a member type of our own: the tar formats have none for a socket
SUMS = "SHA256SUMS"
CHUNK = 1 << 20
MISSING = 3  # the exit status when ROOT is not a folder on the node


def read_held(stream: IO[bytes]) -> Dict[str, str]:
    """The bot's lines: path -> digest."""
    held: Dict[str, str] = {}
    for raw in stream:
        digest, sep, rel = raw.decode("utf-8", "surrogateescape").rstrip("\n").partition("  ")
        if sep and len(digest) == 64 and rel:
            held[rel] = digest.lower()
    return held


def read_sums(root: str) -> Optional[Dict[str, str]]:
    """``ROOT``'s SHA256SUMS as path -> digest, None when it has none."""
    try:
        with open(os.path.join(root, SUMS), "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    out: Dict[str, str] = {}
    for line in raw.decode("utf-8", "surrogateescape").splitlines():
        digest, sep, rel = line.partition("  ")
        if sep and len(digest) == 64:
            out[rel] = digest.lower()
    return out


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def entries(root: str, skip: List[str]) -> List[str]:
    """Every path under ``root`` (relative, POSIX), SHA256SUMS first, folders before their
    contents; links never followed."""
    out: List[str] = []
    top = sorted(n for n in os.listdir(root) if n not in skip)
    if SUMS in top:
        top.remove(SUMS)
        out.append(SUMS)
    pending = [(n, n) for n in reversed(top)]
    while pending:
        rel, _ = pending.pop()
        out.append(rel)
        path = os.path.join(root, rel)
        if stat.S_ISDIR(os.lstat(path).st_mode):
            pending.extend((f"{rel}/{n}", n) for n in sorted(os.listdir(path), reverse=True))
    return out


def member(root: str, rel: str, held: Dict[str, str],
           sums: Optional[Dict[str, str]]) -> "tuple[tarfile.TarInfo, Optional[str]]":
    """The member for ``rel`` and, for a regular file whose bytes go, its path."""
    path = os.path.join(root, rel)
    st = os.lstat(path)
    info = tarfile.TarInfo(rel)
    info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        return info, None
    if stat.S_ISREG(st.st_mode):
        want = held.get(rel)
        if want is not None:
            have = sums.get(rel) if sums is not None else file_digest(path)
            if have == want and rel != SUMS:
                info.pax_headers = {HELD: want}
                return info, None
        info.size = st.st_size
        return info, path
    if stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISFIFO(st.st_mode):
        info.type = tarfile.FIFOTYPE
    elif stat.S_ISCHR(st.st_mode):
        info.type = tarfile.CHRTYPE
    elif stat.S_ISBLK(st.st_mode):
        info.type = tarfile.BLKTYPE
    else:
        info.type = SOCKET
    return info, None


def main(argv: List[str]) -> int:
    root, skip = argv[0], argv[1:]
    held = read_held(sys.stdin.buffer)
    if not os.path.isdir(root):
        sys.stderr.write(f"{root}: no such folder on the node\n")
        return MISSING
    sums = read_sums(root)
    out = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT)
    try:
        for rel in entries(root, skip):
            info, path = member(root, rel, held, sums)
            if path is None:
                out.addfile(info)
                continue
            with open(path, "rb") as fh:
                out.addfile(info, fh)
    finally:
        out.close()
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
