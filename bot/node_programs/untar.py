"""Runs on the node: unpacks the upload's one archive stream (a tar read with the stdlib).

Its text is put in front of ``LAUNCH_SCRIPT`` (``bot/node_programs/__init__.py``), which
runs with the node's own interpreter (Python >= 3.9, standard library only) before the
runner package is there; so this module imports nothing of ours and is also imported by
the tests as it is. The bot writes the archive with ``tarfile`` (``bot/nodes/ssh/archive.py``)
and frames it on the launcher's standard input in chunks: a line ``<n>`` then ``n`` bytes,
``0`` ending it, so the launcher reads its next command right after the archive.

Every member is checked before a byte of it is written: only regular files and folders,
each named relative to the workdir, no absolute name, no ``..``, no symbolic or hard link,
no device or FIFO; a file's folder must not lead out of the workdir through a link. The
first member refused stops the unpacking (the rest of the stream is read and dropped) and
names the member. A file not on the node yet is created under its name (``O_EXCL |
O_NOFOLLOW``: nothing may be there, not even a link); one already there is written to a
temporary name and renamed over it, so a link left under that name is replaced, never
followed; a file cut off midway is removed.
"""

import os
import tarfile
from typing import IO, Any, List, Optional, Set

CHUNK_END = b"0\n"


class Chunks:
    """The archive's bytes from the framed chunks on ``raw`` (a binary stream)."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.left, self.done = raw, 0, False

    def read(self, size: Optional[int] = -1) -> bytes:
        want = size if size is not None and size >= 0 else 1 << 62
        out: List[bytes] = []
        while want > 0 and not self.done:
            if self.left == 0:
                line = self.raw.readline()
                if not line:
                    raise EOFError("the archive stream ended before its end mark")
                self.left = int(line.strip() or b"-1")
                if self.left < 0:
                    raise ValueError(f"a bad chunk header {line[:40]!r}")
                if self.left == 0:
                    self.done = True
                    break
            chunk = self.raw.read(min(want, self.left))
            if not chunk:
                raise EOFError("the archive stream ended in the middle of a chunk")
            out.append(chunk)
            self.left -= len(chunk)
            want -= len(chunk)
        return b"".join(out)

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


def member_refused(member: tarfile.TarInfo) -> Optional[str]:
    """Why ``member`` may not be unpacked, or None."""
    name = member.name
    if not name or name.startswith("/") or os.path.isabs(name):
        return "an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "'..' in its path"
    if member.issym() or member.islnk():
        return "a link"
    if not (member.isreg() or member.isdir()):
        return "not a regular file or a folder"
    return None


def untar(base: str, source: Chunks) -> List[str]:
    """Unpack the archive read from ``source`` (``Chunks``) under the folder ``base``;
    returns the problems met (empty: every member written)."""
    real = os.path.realpath(base)
    failed: List[str] = []
    # Folders made and found to lead nowhere else, looked at once per archive (a project's
    # thousands of files share a few folders); the archive itself makes no link.
    checked: Set[str] = set()
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                why = member_refused(member)
                path = os.path.normpath(os.path.join(real, member.name))
                if why is None and not path.startswith(real + os.sep):
                    why = "outside the workdir"
                if why is not None:
                    failed.append(f"archive member {member.name!r} refused: {why}")
                    break
                try:
                    if member.isdir():
                        os.makedirs(path, exist_ok=True)
                        continue
                    folder = os.path.dirname(path)
                    if folder not in checked:
                        os.makedirs(folder, exist_ok=True)
                        if os.path.realpath(folder) != folder:
                            failed.append(f"archive member {member.name!r} refused: its "
                                          "folder leads out through a link")
                            break
                        checked.add(folder)
                    _write(path, tar.extractfile(member), 0o755 if member.mode & 0o100
                           else 0o644)
                except OSError as exc:
                    failed.append(f"{path}: {exc.strerror or exc}")
    except (tarfile.TarError, ValueError) as exc:
        failed.append(f"the archive cannot be read: {exc}")
    source.drain()
    return failed


def _write(path: str, data: Optional[IO[bytes]], mode: int) -> None:
    """A file nothing is under yet is created in place (``O_EXCL | O_NOFOLLOW``: not even a
    link may be there); one already there (or a link) is written to a temporary name and
    renamed over it, never written through. Cut off midway, what was written is removed."""
    if data is None:
        raise OSError("no data for a regular file")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    tmp: Optional[str] = None
    try:
        fd = os.open(path, flags, mode)  # a fresh node: no rename per file
    except FileExistsError:
        tmp = f"{path}.{os.getpid()}.part"
        fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in iter(lambda: data.read(1 << 20), b""):
                fh.write(chunk)
            os.fchmod(fh.fileno(), mode)  # the umask left aside
        if tmp is not None:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp or path)
        except OSError:
            pass
        raise
