"""External command tasks: run the user's program, then audit its results file.

``task.command`` is an argv list whose items may contain placeholders:
``{inputs}`` (a directory holding links to the items still to process, names unchanged),
``{input_list}`` (a text file, one input path per line), ``{results}`` (the JSON-lines file
the program must write: one ``{"id", "status", "category"|"reason", "output"?}`` per
line) and ``{outputs}`` (the run's outputs directory). The program runs in
``project.dir``. Its results are never trusted: each line goes through the same audit as
an in-process handler's (unknown ids, duplicates, missing ids, categories outside the set
become balance problems), and lines that are not JSON objects are kept as anomalies.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict, List, Sequence

from runner.inputs import Item
from runner.recording import ItemRecorder
from runner.stage import StageContext, StageFailure
from runner.threads import command_env

CHUNK = 1000
STDERR_TAIL = 2000


def expand(argv: Sequence[str], values: Dict[str, str]) -> List[str]:
    out = []
    for arg in argv:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


def prepare_inputs(work: str, items: List[Item]) -> Dict[str, str]:
    inputs_dir = os.path.join(work, "inputs")
    os.makedirs(inputs_dir, exist_ok=True)
    for item in items:
        link = os.path.join(inputs_dir, os.path.basename(item.path))
        if not os.path.lexists(link):
            os.symlink(item.path, link)
    list_path = os.path.join(work, "inputs.txt")
    with open(list_path, "w", encoding="utf-8") as fh:
        fh.write("".join(item.path + "\n" for item in items))
    return {"inputs": inputs_dir, "input_list": list_path}


def run_command(ctx: StageContext, remaining: List[Item],
                recorder: ItemRecorder) -> Dict[str, Any]:
    """Run ``task.command`` on the remaining items and record its audited results."""
    spec = ctx.spec
    argv = list(spec.task.command or [])
    work = os.path.join(ctx.run_dir, "command", f"attempt-{recorder.ledger.attempt}")
    os.makedirs(work, exist_ok=True)
    values = prepare_inputs(work, remaining)
    values["results"] = os.path.join(work, "results.jsonl")
    values["outputs"] = recorder.outputs_dir
    cmd = expand(argv, values)
    cwd = spec.project.dir if os.path.isdir(spec.project.dir or "") else None
    env, threads = command_env(spec.task.torch_threads)
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, check=False)
    except OSError as exc:
        raise StageFailure("pilot", f"task.command {cmd[0]!r} cannot start: "
                           f"{exc.strerror or exc}",
                           hint="check task.command and project.dir") from exc
    results, bad_lines = read_results(values["results"])
    asked = [it.id for it in remaining]
    recorded = 0
    if bad_lines:
        recorder.record(asked, bad_lines)
    for start in range(0, len(results), CHUNK):
        recorded += recorder.record(asked, results[start:start + CHUNK])
    facts = {"command": cmd, "exit_code": proc.returncode, "results_lines": len(results),
             "recorded": recorded, **threads}
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", errors="replace")[-STDERR_TAIL:].strip()
        raise StageFailure("pilot", f"task.command exited with {proc.returncode}"
                           + (f": {tail.splitlines()[-1]}" if tail else ""),
                           facts=facts, error_type="CommandFailed",
                           hint="the results it wrote were recorded; fix it and resume")
    if not os.path.exists(values["results"]):
        raise StageFailure("pilot", f"task.command wrote no results file at {values['results']}",
                           facts=facts, hint="the program must write {results} (JSON lines)")
    return facts


def read_results(path: str) -> tuple[List[Any], List[Any]]:
    """Parsed result lines, and the unparseable ones as bad results naming their line."""
    results: List[Any] = []
    bad: List[Any] = []
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return results, bad
    with fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                results.append(json.loads(raw))
            except ValueError:
                bad.append(f"results line {n} is not JSON: {raw[:80]!r}")
    return results, bad
