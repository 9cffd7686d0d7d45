"""``python -m runner SPEC.json --run-dir DIR [--resume] [--stages A,B]``: diagnostics and
pilot on a node.

``--stages`` runs only the named stages of the table, in the table's order (a stage whose
dependency was not asked for runs anyway). The dispatcher proves each node of a
several-node volume this way (``prepare,interpreter,torch,device,compute,interconnect``).

Exit 0 when every stage passed or was skipped for a reason that is not a failure, 1 when a
stage failed (or was blocked), 2 for an unusable spec or invocation (message on stderr).
Events go to DIR/events.jsonl (appended and flushed first) and then to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, Dict, List, Optional

from runner import __version__
from runner.events import RUN_FINISHED, RUN_STARTED, EventWriter
from runner.spec import RunSpec, SpecError, load_spec

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # exit 2 with our wording, never a traceback
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"runner: {message}\n")


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = _Parser(prog="python -m runner", description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="the run spec (JSON) written by the bot")
    parser.add_argument("--run-dir", required=True, help="this attempt's run directory")
    parser.add_argument("--resume", action="store_true",
                        help="continue a run whose directory already has events.jsonl")
    parser.add_argument("--stages", default=None,
                        help="run only these stages (comma-separated, table order kept)")
    parser.add_argument("--version", action="version", version=f"preflight runner {__version__}")
    args = parser.parse_args(argv)
    if args.stages is not None:
        args.table = chosen_stages(parser, args.stages)
    else:
        args.table = None
    return args


def chosen_stages(parser: argparse.ArgumentParser, text: str) -> List[Any]:
    """The rows of the stage table named in ``text``; a usage error names an unknown one."""
    from runner.stage import STAGE_TABLE

    names = [n.strip() for n in text.split(",") if n.strip()]
    known = [s.name for s in STAGE_TABLE]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"--stages: unknown stage {unknown[0]!r} (known: {', '.join(known)})"
                     if unknown else "--stages: name at least one stage")
    return [s for s in STAGE_TABLE if s.name in names]


def spec_summary(spec: RunSpec) -> Dict[str, Any]:
    return {"name": spec.name, "purpose": spec.purpose, "backend": spec.backend,
            "gpu": spec.hardware.gpu, "cards_per_lot": spec.hardware.cards_per_lot,
            "task": spec.task.kind, "handler": spec.task.handler,
            "inputs": spec.inputs.dir, "expected_count": spec.inputs.expected_count,
            "python": spec.python}


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        print(f"runner: {exc}", file=sys.stderr)
        return EXIT_USAGE
    run_dir = os.path.abspath(args.run_dir)
    events_path = os.path.join(run_dir, "events.jsonl")
    if os.path.exists(events_path) and not args.resume:
        print(f"runner: run directory {run_dir} already has events.jsonl; a run directory is "
              f"never reused (start a new one, or pass --resume to continue this run)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        os.makedirs(run_dir, exist_ok=True)
        if args.resume:
            writer = EventWriter.resume(events_path, spec.run_id, echo=sys.stdout)
        else:
            writer = EventWriter(events_path, spec.run_id, echo=sys.stdout)
    except (OSError, ValueError) as exc:
        print(f"runner: cannot open {events_path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from runner.ladder import Ladder

    try:
        writer.emit(RUN_STARTED, spec=spec_summary(spec), runner_version=__version__,
                    pid=os.getpid(), resume=bool(args.resume), python=sys.executable)
        try:
            finished = Ladder(spec, args.spec, run_dir, bool(args.resume), writer,
                              args.table).run()
        except Exception as exc:  # a bug in the ladder itself: still end the run clearly
            traceback.print_exc()
            finished = {"status": "failed", "stage_reached": None, "first_error": {
                "stage": "runner", "type": type(exc).__name__, "message": str(exc),
                "where": _where(exc), "hint": "an internal error of the runner: the traceback "
                                              "is in runner.log"}}
        writer.emit(RUN_FINISHED, **finished)
    finally:
        writer.close()
    return EXIT_OK if finished["status"] == "passed" else EXIT_FAILED


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""


if __name__ == "__main__":
    sys.exit(main())
