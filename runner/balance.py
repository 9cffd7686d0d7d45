"""The balance rules (DESIGN.md "The balance"), as pure functions.

Every expected input id must appear exactly once: ``accepted`` with an allowed category,
or ``refused`` with a reason. Invented ids, ids returned twice, ids never returned, bad
categories, refusals without a reason and expected refusals that were accepted are
problems, and ``accepted + refused == expected_count`` is checked, not assumed.

The runner computes the balance from its ledger; the bot recomputes it from the
``item.done`` events it recorded, with this same module, so the two cannot drift.
Standard library only.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

ACCEPTED = "accepted"
REFUSED = "refused"
# An id's first result: a result dict, or compute_balance's (status, category, reason)
Outcome = Union[Mapping[str, Any], Tuple[Any, Any, Any]]

PROBLEM_KINDS = (
    "invented",            # an id that is not among the inputs
    "duplicate",           # an id returned more than once
    "missing",             # an expected id never returned (silent disappearance)
    "bad_category",        # accepted with a category outside the allowed set
    "no_reason",           # refused without a reason
    "bad_status",          # status neither accepted nor refused
    "bad_id",              # a result without a usable id
    "bad_output",          # an output the runner cannot write (not JSON)
    "unexpected_accept",   # an expected refusal that was accepted
    "count_mismatch",      # accepted + refused != expected_count
)


@dataclass(frozen=True)
class Problem:
    kind: str
    id: Optional[str]
    detail: str

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.kind} {self.id}: {self.detail}" if self.id else f"{self.kind}: {self.detail}"


@dataclass
class Balance:
    accepted: int
    refused: int
    total: int
    problems: List[Problem] = field(default_factory=list)
    warnings: List[Problem] = field(default_factory=list)
    by_category: Dict[str, int] = field(default_factory=dict)
    rows: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = f"accepted {self.accepted} + refused {self.refused} of {self.total}"
        if self.ok:
            return head + ": balance ok"
        names = "; ".join(str(p) for p in self.problems[:10])
        more = f" (+{len(self.problems) - 10} more)" if len(self.problems) > 10 else ""
        return f"{head}: {len(self.problems)} problem(s): {names}{more}"

    def to_dict(self) -> Dict[str, Any]:
        return {
            "accepted": self.accepted,
            "refused": self.refused,
            "total": self.total,
            "ok": self.ok,
            "problems": [p.to_dict() for p in self.problems],
            "warnings": [p.to_dict() for p in self.warnings],
            "by_category": dict(self.by_category),
        }


MISSING_LOST = ("its output was lost by the node that wrote it, so the ledger forgot it "
                "(lost_outputs.jsonl): `preflight resume RUN` runs it again")


class Tally:
    """The per-id rules, fed one expected id at a time (the balance of a large run is
    computed while streaming the ledger, without holding every result in memory).

    Call :meth:`judge` once per expected id with its first result (``None`` when it was
    never returned), then :meth:`finish`. ``keep_rows`` keeps the per-id rows in the
    returned :class:`Balance` (off for a streamed balance: its rows go to a file).
    """

    def __init__(self, expected_refusals: Iterable[str], categories: Sequence[str],
                 *, keep_rows: bool = True, forgotten: Optional[Set[str]] = None) -> None:
        self.refusals = set(expected_refusals)
        self.forgotten = forgotten or set()  # ids whose output was lost with its node
        self.allowed = list(categories)
        self.keep_rows = keep_rows
        self.accepted = 0
        self.refused = 0
        self.expected = 0
        self.problems: List[Problem] = []
        self.warnings: List[Problem] = []
        self.by_category = {c: 0 for c in self.allowed}
        self.rows: List[Dict[str, Any]] = []

    def judge(self, iid: str, res: Optional[Outcome]) -> None:
        """``res``: the id's first result (a dict, or ``compute_balance``'s compact
        (status, category, reason)), None when it never came."""
        self.expected += 1
        if res is None:
            self.problems.append(Problem("missing", iid, MISSING_LOST if iid in self.forgotten
                                         else "never returned (silent disappearance)"))
            return
        if not isinstance(res, tuple):
            res = (res.get("status"), res.get("category"), res.get("reason"))
        status, cat, reason = res
        if status == ACCEPTED:
            self.accepted += 1
            if cat in self.by_category:
                self.by_category[cat] += 1
            else:
                self.problems.append(Problem("bad_category", iid,
                                             f"category {cat!r} is not one of {self.allowed}"))
            if iid in self.refusals:
                self.problems.append(Problem("unexpected_accept", iid,
                                             "listed in expected_refusals but was accepted"))
        elif status == REFUSED:
            self.refused += 1
            if not _text(reason):
                self.problems.append(Problem("no_reason", iid, "refused without a reason"))
            if iid not in self.refusals:
                detail = f"refused but not an expected refusal: {reason}"
                self.warnings.append(Problem("unexpected_refusal", iid, detail))
        else:
            self.problems.append(Problem("bad_status", iid,
                                         f"status {status!r} is neither accepted nor refused"))
            return
        if self.keep_rows:
            self.rows.append({"id": iid, "status": status,
                              "category": cat if status == ACCEPTED else None,
                              "reason": reason if status == REFUSED else None})

    def finish(self, expected_count: Optional[int] = None) -> Balance:
        total = self.expected if expected_count is None else int(expected_count)
        _check_counts(self.expected, expected_count, self.accepted, self.refused, total,
                      self.problems)
        return Balance(accepted=self.accepted, refused=self.refused, total=total,
                       problems=self.problems, warnings=self.warnings,
                       by_category=self.by_category, rows=self.rows)


def compute_balance(
    expected_ids: Iterable[str],
    expected_refusals: Iterable[str],
    categories: Sequence[str],
    results: Iterable[Dict[str, Any]],
    *,
    expected_count: Optional[int] = None,
    keep_rows: bool = True,
) -> Balance:
    """Check ``results`` (item.done-like dicts) against the expected ids.

    ``expected_count`` is the manifest's figure; when given it is the total the sums are
    checked against, and a listing of a different size is itself a problem. The first
    result of an id counts; later ones are reported as duplicates, except a ``rerun`` one
    (its input run again after its output was lost with its node: it replaces the first).
    ``keep_rows=False``: the sums and problems only, no per-id rows.
    """
    expected = list(dict.fromkeys(expected_ids))
    expected_set = set(expected)
    # each id's first result kept as (status, category, reason), its strings shared: a
    # million results held as dicts took the bot past 1.5 GB (bench/million.py)
    first: Dict[str, Outcome] = {}
    problems: List[Problem] = []
    for result in results:
        _check_one(result, expected_set, first, problems)
    tally = Tally(expected_refusals, categories, keep_rows=keep_rows)
    tally.problems.extend(problems)
    for iid in expected:
        tally.judge(iid, first.get(iid))
    return tally.finish(expected_count)


def _check_one(result: Any, expected: Set[str], first: Dict[str, Outcome],
               problems: List[Problem]) -> None:
    if not isinstance(result, dict):
        problems.append(Problem("bad_id", None, f"result is not an object: {result!r:.80}"))
        return
    iid = result.get("id")
    if not isinstance(iid, str) or not iid:
        problems.append(Problem("bad_id", None, f"result without a usable id: {result!r:.120}"))
        return
    if iid not in expected:
        problems.append(Problem("invented", iid, "not among the inputs"))
        return
    if iid in first and result.get("rerun") is not True:
        problems.append(Problem("duplicate", iid, "returned more than once"))
        return
    status = result.get("status")
    if status not in (ACCEPTED, REFUSED):
        problems.append(Problem("bad_status", iid,
                                f"status {status!r} is neither accepted nor refused"))
        return
    category, reason = result.get("category"), result.get("reason")
    first[iid] = (sys.intern(status),
                  sys.intern(category) if isinstance(category, str) else category,
                  reason)


def _check_counts(found: int, expected_count: Optional[int], accepted: int,
                  refused: int, total: int, problems: List[Problem]) -> None:
    if expected_count is not None and expected_count != found:
        detail = f"{found} inputs found, expected_count is {expected_count}"
        problems.append(Problem("count_mismatch", None, detail))
    if accepted + refused != total:
        problems.append(Problem("count_mismatch", None,
                                f"accepted {accepted} + refused {refused} = "
                                f"{accepted + refused}, expected {total}"))


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def problems_text(problems: Iterable[Dict[str, Any]]) -> str:
    """One line naming each problem of a serialized balance (for messages)."""
    parts = []
    for p in problems:
        iid = p.get("id")
        parts.append(f"{p.get('kind')} {iid}: {p.get('detail')}" if iid else
                     f"{p.get('kind')}: {p.get('detail')}")
    return "; ".join(parts)
