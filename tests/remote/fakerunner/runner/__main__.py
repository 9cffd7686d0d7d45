"""``python -m runner SPEC --run-dir DIR``: writes events like the real runner, on cue.

It lists the inputs named by the spec (so the test sees the paths were rewritten for the
node), emits one ``item.done`` per input and, when ``task.params.gate_after`` is set,
waits after that many items until a file ``go`` appears in the run directory; with
``task.params.die_after`` it says why on stderr after that many items and dies (exit 9)
without ``run.finished``, like a runner the kernel killed. ``task.params.plant`` lists
what the "team's code" leaves in the run directory before it ends (``plant``).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from datetime import datetime, timezone


def main() -> int:
    spec_path, run_dir = sys.argv[1], sys.argv[sys.argv.index("--run-dir") + 1]
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    params = spec["task"].get("params") or {}
    path = os.path.join(run_dir, "events.jsonl")
    seq = [0]
    out = open(path, "a", encoding="utf-8")

    def emit(etype: str, **data: object) -> None:
        seq[0] += 1
        line = {"seq": seq[0], "type": etype, "run": spec["run_id"],
                "ts": datetime.now(timezone.utc).isoformat(), **data}
        out.write(json.dumps(line, sort_keys=True) + "\n")
        out.flush()

    inputs = sorted(glob.glob(os.path.join(spec["inputs"]["dir"], spec["inputs"]["pattern"])))
    emit("run.started")
    emit("stage.started", stage="prepare")
    emit("stage.passed", stage="prepare",
         facts={"inputs_dir": spec["inputs"]["dir"], "count": len(inputs),
                "python": sys.executable, "cwd": os.getcwd()})
    emit("stage.started", stage="pilot")
    gate = params.get("gate_after")
    for n, item in enumerate(inputs):
        if params.get("die_after") == n:
            sys.stderr.write(f"fake runner: out of patience at item {n}\n")
            sys.stderr.flush()
            os._exit(9)
        if gate is not None and n == gate:
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(run_dir, "go")):
                if time.monotonic() > deadline:
                    return 3
                time.sleep(0.02)
        stem = os.path.splitext(os.path.basename(item))[0]
        emit("item.done", id=stem, status="accepted", category="invoice")
        emit("progress", done=n + 1, total=len(inputs))
    emit("stage.passed", stage="pilot", facts={"done": len(inputs)})
    emit("stage.started", stage="balance")
    emit("balance", accepted=len(inputs), refused=0, total=len(inputs), ok=True, problems=[])
    emit("stage.passed", stage="balance", facts={"ok": True})
    plant(run_dir, params.get("plant") or [])
    emit("stage.skipped", stage="evidence", reason="no copy_to")
    emit("run.finished", status="passed", stage_reached="balance", first_error=None)
    out.close()
    return 0


def plant(run_dir: str, entries: list) -> None:
    """What a team's code may leave in its run directory: ``{"path", "link": target}`` a
    symbolic link, ``{"path", "fifo": true}`` a FIFO, ``{"path", "bytes": n}`` a file."""
    for entry in entries:
        path = os.path.join(run_dir, entry["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if "link" in entry:
            os.symlink(entry["link"], path)
        elif entry.get("fifo"):
            os.mkfifo(path)
        else:
            with open(path, "wb") as fh:
                fh.write(b"x" * int(entry["bytes"]))


if __name__ == "__main__":
    sys.exit(main())
