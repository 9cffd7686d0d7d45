"""Runs on the node: SHA-256 of files, remembered across dispatches by their stat.

Its text is put in front of the launcher's (``LAUNCH_SCRIPT``) and the corpus listing's
(``NODE_CORPUS_SCRIPT``), which run with the node's own interpreter (Python >= 3.9,
standard library only); so it imports nothing of ours, and the tests import it as it is.

A file whose size, modification time, change time and inode are the ones remembered is
not read again: a resume or a second dispatch over 100,000 unchanged inputs costs one
``stat`` each instead of reading them all. A file changed in the last second is
hashed but not remembered (a write in the same clock tick as the hash would keep its old
time). The memory is one JSON file in the node's workdir, replaced whole (a temporary
file renamed) and holding only the files seen by the last listing; one that cannot be
read or written is ignored (everything is hashed, as without it). It is the node's own
shortcut: what the node answers is checked by the bot as before, never trusted more.
"""

import hashlib
import json
import os
import time
from typing import Dict, List, Optional

RACY_NS = 1_000_000_000  # a file changed this recently is hashed each time


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class HashCache:
    """``sha256(path, st)``: the remembered digest when ``st`` matches, else read."""

    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self.old: Dict[str, List[object]] = {}
        self.new: Dict[str, List[object]] = {}
        self.read = 0  # files actually read (the rest came from memory)
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    loaded = json.load(fh)
                if isinstance(loaded, dict):
                    self.old = loaded
            except (OSError, ValueError):
                self.old = {}

    def sha256(self, path: str, st: os.stat_result) -> str:
        key: List[object] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        hit = self.old.get(path)
        if isinstance(hit, list) and len(hit) == 5 and hit[:4] == key \
                and isinstance(hit[4], str):
            digest = hit[4]
        else:
            digest = file_sha256(path)
            self.read += 1
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
            self.new[path] = key + [digest]
        return digest

    def save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.new, fh, separators=(",", ":"))
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
