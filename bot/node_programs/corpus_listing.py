"""Runs on the node: lists and checksums a corpus already there (``volume.inputs.on_nodes``).

Run with the node's own interpreter (``python -c <this text> DIR PATTERN DIGEST [CACHE]``,
Python >= 3.9, standard library only, ``hashcache.py``'s text in front of it; the bot
imports it too, for the same listing rule on its own copy). ``CACHE``: the file where the
node remembers each input's digest by its stat (size, times, inode), so a second dispatch
or a resume reads only the files that changed.

The listing is the runner's (``runner.inputs.list_dir``): regular files directly in
``DIR`` whose name matches ``PATTERN``, hidden files left out, sorted by name. Each row is
``name``, size and SHA-256 (several files hashed at once); the listing's digest is the
SHA-256 of its rows as ``name<TAB>size<TAB>sha256<LF>``. It prints a JSON line: ``count``
and ``digest``, then the rows themselves, one a line, only when the digest is not ``DIGEST``
(what the bot expects), so a copy that agrees costs one short line whatever its size, and
one that differs tells the bot its first differing input. A folder that cannot be listed
prints ``error``.
"""

import fnmatch
import hashlib
import json
import os
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, List, Optional, Tuple

if TYPE_CHECKING:  # on the node: hashcache.py's text, put in front of this one
    from bot.node_programs.hashcache import HashCache

Row = Tuple[str, int, str]


def listed(directory: str, pattern: str) -> List[Tuple[str, str]]:
    """(name, path) of each input, the runner's rule."""
    out = []
    for name in sorted(os.listdir(directory)):
        if name.startswith(".") or not fnmatch.fnmatchcase(name, pattern):
            continue
        path = os.path.join(directory, name)
        try:
            if stat.S_ISREG(os.stat(path).st_mode):
                out.append((name, path))
        except OSError:
            continue
    return out


def file_row(item: Tuple[str, str], cache: Optional["HashCache"] = None) -> Row:
    name, path = item
    st = os.stat(path)
    if cache is not None:
        return name, st.st_size, cache.sha256(path, st)
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return name, size, digest.hexdigest()


def listing_digest(rows: List[Row]) -> str:
    digest = hashlib.sha256()
    for name, size, sha in rows:
        digest.update(f"{name}\t{size}\t{sha}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def main(argv: List[str]) -> int:
    directory, pattern, expected = argv[:3]
    cache = HashCache(os.path.expanduser(argv[3])) if len(argv) > 3 and argv[3] else None
    try:
        items = listed(directory, pattern)
        with ThreadPoolExecutor(8) as pool:
            rows = list(pool.map(lambda item: file_row(item, cache), items))
    except OSError as exc:
        print(json.dumps({"error": f"{directory}: {exc.strerror or exc}"}))
        return 0
    if cache is not None:
        cache.save()
    digest = listing_digest(rows)
    out = sys.stdout
    out.write(json.dumps({"count": len(rows), "digest": digest}) + "\n")
    if digest != expected:
        for row in rows:  # one a line: a million rows are never one line
            out.write(json.dumps(list(row)) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
