"""The verdict: the pilot measured against the manifest's success criteria."""

from __future__ import annotations

from typing import Any

from bot.pilot.balance_check import NODE_LISTED, node_listed
from bot.pilot.cards import CARD_STAGES, healthy_cards
from bot.pilot.payloads import Balance, Evidence
from bot.pilot.record import Run


def judge(run: Run, stages: list[dict[str, Any]],
          finished: dict[str, Any]) -> dict[str, Any]:
    """Each criterion as a check with a sentence; the pilot passes only if all hold."""
    checks: list[dict[str, Any]] = []
    failed = [s["stage"] for s in stages if s["state"] == "failed"]
    checks.append(_check(not failed, "every stage passed or was skipped for a stated reason"
                         if not failed else f"stage(s) failed: {', '.join(failed)}"))
    cards = _cards_check(run, stages)
    if cards is not None:
        checks.append(cards)
    success = run.success or {}
    balance = run.balance
    if balance is None:
        checks.append(_check(False, "no balance was produced"))
    elif balance.malformed:
        checks.append(_check(False, "the runner's balance cannot be read: "
                                    + "; ".join(balance.malformed)))
    else:
        accepted, refused = balance.accepted or 0, balance.refused or 0
        total = balance.total or 0
        if success.get("balance_ok", True):
            n = len(balance.problems)
            listed = f" ({NODE_LISTED})" if node_listed(run) else ""
            checks.append(_check(balance.ok,
                                 f"balance holds: {accepted} accepted + {refused} refused = "
                                 f"{total}{listed}" if balance.ok else
                                 f"balance fails with {n} problem(s){listed}"))
        if success.get("min_accepted") is not None:
            want = int(success["min_accepted"])
            checks.append(_check(accepted >= want, f"accepted {accepted} ≥ {want} required"))
        if success.get("max_refused") is not None:
            cap = int(success["max_refused"])
            checks.append(_check(refused <= cap, f"refused {refused} ≤ {cap} allowed"))
        unexpected = _unexpected_refusals(balance)
        if unexpected is not None:
            checks.append(unexpected)
        checks += [{"ok": True, "warn": True, "text": w.detail}  # run again after a lost node
                   for w in balance.warnings if w.kind == "outputs_lost"][:1]
    evidence = run.evidence
    if evidence and evidence.fetch_error:
        # the results stayed on the node: what the events said is kept, but not taken as
        # proven until a fetch brings the results back (`preflight fetch RUN`)
        checks.append(_check(False, f"the results were not brought back from the node: "
                                    f"{evidence.fetch_error} (`preflight fetch {run.id}` "
                                    "tries again)"))
    if success.get("require_evidence") or success.get("copy_to"):
        checks.append(_evidence_check(evidence))
    if finished.get("status") not in (None, "passed"):
        checks.append(_check(False, f"the runner reported the run as {finished.get('status')}"))
    return {"passed": all(c["ok"] for c in checks), "checks": checks}


def _evidence_check(evidence: Evidence | None) -> dict[str, Any]:
    """The evidence copy verified, saying who verified it when the bot host did not: a URL
    copy made from an SSH node is checked by that node only (its claim)."""
    if evidence is None or not evidence.verified:
        return _check(False, "evidence copy missing or not verified")
    if evidence.verified_by == "node":
        return _check(True, f"evidence copy verified as claimed by the node at "
                            f"{evidence.dest} (the bot host did not check it: run "
                            "`preflight verify` on it from a machine that can read it)")
    return _check(True, "evidence copy verified")


UNEXPECTED_SHOWN = 5  # refusals outside expected_refusals named in the verdict's line


def _unexpected_refusals(balance: Balance) -> dict[str, Any] | None:
    """A warning line naming the refusals outside ``expected_refusals`` (the balance's
    ``unexpected_refusal`` warnings), each with its reason: a passed verdict no longer
    hides an input nobody expected to be refused (they still count against
    ``success.max_refused``). None when there are none."""
    warnings = [w for w in balance.warnings if w.kind == "unexpected_refusal"]
    if not warnings:
        return None
    count = balance.warnings_count
    total = count if count is not None and count >= len(warnings) else len(warnings)
    prefix = "refused but not an expected refusal: "
    named = "; ".join(f"{w.id} ({w.detail.removeprefix(prefix)})"
                      for w in warnings[:UNEXPECTED_SHOWN])
    more = f"; and {total - UNEXPECTED_SHOWN} more (balance.csv)" \
        if total > UNEXPECTED_SHOWN else ""
    where = "; where the handler raised: handler_errors.jsonl in the run directory" \
        if any("task.handler raised" in w.detail for w in warnings) else ""
    return {"ok": True, "warn": True,
            "text": f"{total} refusal(s) outside expected_refusals, counted against "
                    f"max_refused: {named}{more}{where}"}


def _cards_check(run: Run, stages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The healthy cards the card stages left against what the volume needs: one card, or
    ``volume.cards_per_worker`` (a worker owns that many). Whatever
    ``diagnostics.slow_card`` says, a node with fewer never passes. None: no card stage
    reported healthy cards (a CPU run)."""
    healthy = healthy_cards(stages)
    if healthy is None:
        return None
    volume = run.manifest.volume if run.manifest is not None else None
    need = volume.cards_per_worker if volume is not None else 1
    seen = max((len(_facts(row).get("cards") or {}) for row in stages
                if row.get("stage") in CARD_STAGES and isinstance(_facts(row).get("cards"), dict)),
               default=len(healthy))
    why = " (volume.cards_per_worker)" if need > 1 else ""
    text = f"healthy cards: {len(healthy)} of {seen} left, {need} needed{why}"
    if len(healthy) >= need:
        return _check(True, text)
    out = []
    for row in stages:
        rows = _facts(row).get("cards")
        if row.get("stage") not in CARD_STAGES or not isinstance(rows, dict):
            continue
        bad = [f"GPU {k}: {'; '.join(map(str, c.get('reasons') or []))}"
               for k, c in sorted(rows.items(), key=lambda kv: str(kv[0]))
               if isinstance(c, dict) and c.get("reasons")]
        if bad:
            out.append(f"{row['stage']} left out {'; '.join(bad)}")
    named = f" ({'; '.join(out)})" if out else ""
    return _check(False, f"{text}{named}: replace the node or ask the provider")


def _facts(row: dict[str, Any]) -> dict[str, Any]:
    facts = row.get("facts")
    return facts if isinstance(facts, dict) else {}


def _check(ok: bool, text: str) -> dict[str, Any]:
    return {"ok": bool(ok), "text": text}
