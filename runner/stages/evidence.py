"""The evidence stage: the run's evidence copied to ``results.copy_to/<run-id>/``, then
read back and verified. Judged by its progress (``StageDef.idle``): every file, member and
MiB it moves is a ``ctx.beat``. Standard library only at import time.
"""

from __future__ import annotations

from typing import Any, Dict

from runner.stage import StageContext, StageFailure, StageSkipped


def _not_produced(run_dir: str) -> list[str]:
    import os

    return [n for n in ("balance.json", "balance.csv")
            if not os.path.isfile(os.path.join(run_dir, n))]


def _write_provenance(ctx: StageContext) -> None:
    import json
    import os

    from runner.files import write_text_atomic
    from runner.provenance import NAME, provenance

    write_text_atomic(os.path.join(ctx.run_dir, NAME),
                      json.dumps(provenance(ctx.spec), indent=2, sort_keys=True) + "\n")


PROGRESS_EVERY_S = 60.0


class _Pulse:
    """The copy's beats handed to the stage's judge; once a minute also an
    ``evidence.progress`` event (beats come from several threads)."""

    def __init__(self, ctx: StageContext, every_s: float) -> None:
        import threading
        import time

        self.ctx, self.every_s, self.clock = ctx, every_s, time.monotonic
        self.last, self.lock = self.clock(), threading.Lock()

    def __call__(self, where: str) -> None:
        from runner.events import EVIDENCE_PROGRESS

        self.ctx.beat(where)
        if self.clock() - self.last < self.every_s:
            return
        with self.lock:
            if self.clock() - self.last < self.every_s:
                return
            self.last = self.clock()
        try:
            self.ctx.emit(EVIDENCE_PROGRESS, at=where)
        except RuntimeError:  # the stage was abandoned after its timeout
            pass


def evidence(ctx: StageContext, progress_every_s: float = PROGRESS_EVERY_S) -> Dict[str, Any]:
    """Copy the evidence to results.copy_to/<run_id>/, then read it back and verify."""
    from runner.evidence import EvidenceError, copy_evidence, join_dest

    dest = ctx.spec.results.copy_to
    if not dest:
        raise StageSkipped("no copy_to in the manifest")
    target = join_dest(dest, ctx.spec.run_id)
    try:
        _write_provenance(ctx)
        report = copy_evidence(ctx.run_dir, target, _Pulse(ctx, progress_every_s))
    except (EvidenceError, OSError) as exc:
        raise StageFailure("evidence", str(exc),
                           hint="check results.copy_to is writable from this node") from exc
    ctx.emit("evidence", dest=target, files=report.files, bytes=report.bytes,
             shards=report.shards, verified=report.verified, problems=report.problems)
    facts = {"dest": target, "files": report.files, "bytes": report.bytes,
             "shards": report.shards, "verified": report.verified}
    unmade = _not_produced(ctx.run_dir)
    if unmade:  # an earlier stage failed: what it made is copied, the rest named
        facts["partial"] = f"the run failed before producing {', '.join(unmade)}"
        others = [p for p in report.problems if not any(p.startswith(f"{u}:") for u in unmade)]
        if not others:
            return facts
    if not report.verified:
        raise StageFailure("evidence", "the copy does not verify: " + "; ".join(report.problems),
                           facts=facts, hint="re-run the copy; check the destination's disk")
    return facts
