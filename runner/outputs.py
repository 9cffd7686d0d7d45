"""Where a run's outputs lie, and how one input's output is found by its id (part of the
bot/runner contract; standard library only).

A volume's Ray worker writes the outputs its handler returns (a dict or a list per input)
where the handler runs, on its own node, **one JSONL shard per batch**:
``outputs/shards/<attempt>-<worker>-<seq>.jsonl``, one line ``{"id": ..., "output": ...}``
per input, written under a temporary name, flushed and fsynced once, then renamed
(``ShardWriter``). Only then does the worker answer; the driver records each input with a
reference to its line, ``outputs/shards/a1-w3-000017.jsonl#12`` (``ref``; line numbers
from 1), so an input is done in the ledger only once its output is complete under its
final name. A file the handler writes itself into ``ctx.outputs_dir`` and names by its
path stays a file (``outputs/<name>``). The ledger, ``balance.csv``'s ``output`` column
and the ``item.done`` events carry the reference; ``read_output`` gives one input's
output back from it (``preflight outputs RUN ID``).

What a worker refuses instead of recording (the input is refused with the reason, the
rest of its batch is recorded): an output that is not JSON, one over ``MAX_OUTPUT_BYTES``,
a path output outside the outputs folder.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

from runner.errors import RunnerError
from runner.files import atomic_open, is_temp_name

OUTPUTS = "outputs"
SHARDS = "shards"
SHARD_SUFFIX = ".jsonl"
MAX_OUTPUT_BYTES = 16 << 20  # one input's output, as JSON
MAX_LINE_BYTES = MAX_OUTPUT_BYTES + (1 << 16)


class OutputsError(RunnerError, RuntimeError):
    """An output cannot be written (the node's disk) or read back (a reference that leads
    nowhere); the message names the file."""


class Ref(NamedTuple):
    path: str  # relative to the run directory: outputs/shards/<name>.jsonl
    line: int  # from 1


def ref(path: str, line: int) -> str:
    return f"{path}#{line}"


def parse_ref(text: Optional[str]) -> Optional[Ref]:
    """The shard and line a reference names, or None (no reference, or a plain file's
    path). A reference that leaves the outputs folder is None too."""
    if not text or "#" not in text:
        return None
    path, _, line = text.rpartition("#")
    parts = path.split("/")
    if not line.isdigit() or int(line) < 1 or path.startswith("/") or ".." in parts \
            or parts[:2] != [OUTPUTS, SHARDS] or not path.endswith(SHARD_SUFFIX):
        return None
    return Ref(path, int(line))


def file_of(text: str) -> str:
    """The file an output column names: a shard reference's shard, else the text."""
    found = parse_ref(text)
    return found.path if found else text


def shard_prefix(attempt: int, key: int) -> str:
    """The names of a worker's shards begin ``a<attempt>-w<key>-`` (``ShardWriter``): the
    driver holds what a worker records to its own prefix."""
    return f"a{attempt}-w{key}"


def is_shard(path: str) -> bool:
    """A run-relative path of a worker's shard (``outputs/shards/<name>.jsonl``)."""
    parts = path.split("/")
    return len(parts) == 3 and parts[:2] == [OUTPUTS, SHARDS] \
        and parts[2].endswith(SHARD_SUFFIX) and parts[2] not in (".", "..") \
        and "#" not in parts[2]


class ShardWriter:
    """On a worker: a batch's outputs into one shard of ``run_dir/outputs/shards``.

    ``prefix`` names this worker's shards (``a<attempt>-w<key>``): unique per worker of
    one attempt, so the shards of several nodes collected to the head never collide."""

    def __init__(self, run_dir: str, prefix: str) -> None:
        self.run_dir = os.path.abspath(run_dir)
        self.outputs = os.path.join(self.run_dir, OUTPUTS)
        self.folder = os.path.join(self.outputs, SHARDS)
        self.prefix = prefix
        self.seq = 0
        self.written: List[Dict[str, Any]] = []  # since the last ``drain``

    def drain(self) -> List[Dict[str, Any]]:
        """The shards written since the last call, each ``{"shard": "outputs/shards/<name>",
        "bytes", "sha256"}``: the worker's record, which the driver keeps on the head and
        the collection checks each shard brought from this node against."""
        written, self.written = self.written, []
        return written

    def write(self, results: Any) -> Any:
        """``results`` (a handler's answer for one batch) with every dict or list output
        written to one shard, durable under its final name, and replaced by its reference;
        a path output made relative to the run directory. What a result cannot keep (not
        JSON, too large, a path outside the outputs folder) refuses that input with the
        reason. Anything else (not a list, a result without an id) is left for the
        driver's audit."""
        if not isinstance(results, (list, tuple)):
            return results
        out: List[Any] = []
        lines: List[bytes] = []
        name = self._next_name()
        rel = f"{OUTPUTS}/{SHARDS}/{name}"
        for res in results:
            if not isinstance(res, dict) or not isinstance(res.get("id"), str) \
                    or "output" not in res:
                out.append(res)
                continue
            output, problem = res["output"], None
            if isinstance(output, (dict, list)):
                line, problem = _line(res["id"], output)
                if line is not None:
                    lines.append(line)
                    output = ref(rel, len(lines))
            elif isinstance(output, str):
                output, problem = self._path(output)
            if problem:
                out.append({"id": res["id"], "status": "refused", "reason": problem})
            else:
                out.append({**res, "output": output})
        if lines:
            self._write(name, lines)
        return out

    def _next_name(self) -> str:
        """The next shard's name; one already there (a run directory written by another
        attempt under the same number) is never replaced: the number moves past it."""
        while True:
            name = f"{self.prefix}-{self.seq + 1:06d}{SHARD_SUFFIX}"
            if not os.path.lexists(os.path.join(self.folder, name)):
                return name
            self.seq += 1

    def _write(self, name: str, lines: List[bytes]) -> None:
        path = os.path.join(self.folder, name)
        data = b"".join(lines)
        try:
            os.makedirs(self.folder, exist_ok=True)
            with atomic_open(path, binary=True) as fh:  # one flush + fsync, then the rename
                fh.write(data)
        except OSError as exc:
            raise OutputsError(f"the batch's outputs could not be written to {path}: "
                               f"{type(exc).__name__}: {exc}") from exc
        self.seq += 1
        self.written.append({"shard": f"{OUTPUTS}/{SHARDS}/{name}", "bytes": len(data),
                             "sha256": hashlib.sha256(data).hexdigest()})

    def _path(self, output: str) -> Tuple[Any, Optional[str]]:
        """A file the handler wrote: its path relative to the run directory, inside
        ``outputs/``; else why it is refused."""
        full = output if os.path.isabs(output) else os.path.join(self.run_dir, output)
        real = os.path.realpath(full)
        top = os.path.realpath(self.outputs)
        if not real.startswith(top + os.sep):
            return None, (f"output path {output[:300]!r} lies outside the outputs folder "
                          f"({self.outputs}); a handler writes its files into "
                          "ctx.outputs_dir")
        return os.path.relpath(real, os.path.realpath(self.run_dir)).replace(os.sep, "/"), None


def _line(iid: str, output: Any) -> Tuple[Optional[bytes], Optional[str]]:
    try:
        line = json.dumps({"id": iid, "output": output}, sort_keys=True,
                          allow_nan=False).encode("utf-8") + b"\n"
    except (TypeError, ValueError, RecursionError) as exc:
        return None, f"output is not JSON ({type(exc).__name__}: {str(exc)[:200]})"
    if len(line) > MAX_OUTPUT_BYTES:
        return None, (f"output of {len(line)} bytes as JSON, over the {MAX_OUTPUT_BYTES} "
                      "bytes an output may have; write a large output as a file into "
                      "ctx.outputs_dir and return its path")
    return line, None


def read_output(run_dir: str, text: str, iid: str) -> Any:
    """The output ``text`` (a reference, as the ledger holds it) names for input ``iid``,
    read from ``run_dir`` (never through a link); OutputsError when it leads nowhere."""
    found = parse_ref(text)
    if found is None:
        raise OutputsError(f"{text!r} is not a shard reference (outputs/shards/<name>.jsonl"
                           "#<line>)")
    path = os.path.join(run_dir, found.path)
    for n, raw in enumerate(_lines(path), 1):
        if n < found.line:
            continue
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise OutputsError(f"{found.path} line {n}: not JSON ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("id") != iid:
            got = doc.get("id") if isinstance(doc, dict) else None
            raise OutputsError(f"{found.path} line {n} holds the output of {got!r}, "
                               f"not of {iid!r}")
        return doc.get("output")
    raise OutputsError(f"{found.path} has no line {found.line}")


def _lines(path: str) -> Iterator[bytes]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise OutputsError(f"{path}: cannot be read ({type(exc).__name__}: "
                           f"{exc.strerror or exc})") from exc
    with os.fdopen(fd, "rb") as fh:
        while True:
            raw = fh.readline(MAX_LINE_BYTES)
            if not raw:
                return
            yield raw


def summary(run_dir: str) -> Dict[str, Any]:
    """What ``run_dir/outputs`` holds: shards (files, bytes, lines), other files (files,
    bytes), and the listings of outputs kept on their nodes (``on_nodes/node-<i>.json``).
    Walked with lstat, links not followed, temporary files left out."""
    top = os.path.join(run_dir, OUTPUTS)
    found: Dict[str, Any] = {"dir": top, "shards": 0, "shard_bytes": 0, "files": 0,
                             "file_bytes": 0, "on_nodes": []}
    for base, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(base, d)))
        for name in sorted(names):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, run_dir).replace(os.sep, "/")
            if is_temp_name(name) or name.startswith(".") or os.path.islink(path):
                continue
            try:
                size = os.lstat(path).st_size
            except OSError:  # gone meanwhile
                continue
            if rel.startswith(f"{OUTPUTS}/{SHARDS}/") and name.endswith(SHARD_SUFFIX):
                found["shards"] += 1
                found["shard_bytes"] += size
            elif rel.startswith(f"{OUTPUTS}/on_nodes/"):
                found["on_nodes"].append(rel)
            else:
                found["files"] += 1
                found["file_bytes"] += size
    return found


__all__ = ["OUTPUTS", "SHARDS", "MAX_OUTPUT_BYTES", "OutputsError", "Ref", "ShardWriter",
           "ref", "parse_ref", "file_of", "read_output", "summary"]
