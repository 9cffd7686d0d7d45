from __future__ import annotations

from typing import Any

from runner.balance import compute_balance

IDS = ["a", "b", "c", "d"]
CATS = ["x", "y"]


def ok_results() -> list[dict[str, Any]]:
    return [{"id": "a", "status": "accepted", "category": "x"},
            {"id": "b", "status": "accepted", "category": "y"},
            {"id": "c", "status": "accepted", "category": "x"},
            {"id": "d", "status": "refused", "reason": "not UTF-8"}]


def kinds(results: list[dict[str, Any]], **kw: Any) -> list[tuple[str, Any]]:
    bal = compute_balance(IDS, ["d"], CATS, results, **kw)
    return [(p.kind, p.id) for p in bal.problems]


def test_a_clean_balance() -> None:
    bal = compute_balance(IDS, ["d"], CATS, ok_results(), expected_count=4)
    assert bal.ok and (bal.accepted, bal.refused, bal.total) == (3, 1, 4)
    assert bal.by_category == {"x": 2, "y": 1}
    assert [r["id"] for r in bal.rows] == IDS
    d = bal.to_dict()
    assert d["ok"] is True and d["problems"] == [] and d["by_category"] == {"x": 2, "y": 1}


def test_invented_id() -> None:
    res = ok_results() + [{"id": "zz", "status": "accepted", "category": "x"}]
    assert kinds(res) == [("invented", "zz")]


def test_duplicate_id_counts_once() -> None:
    res = ok_results() + [{"id": "b", "status": "refused", "reason": "again"}]
    bal = compute_balance(IDS, ["d"], CATS, res)
    assert [(p.kind, p.id) for p in bal.problems] == [("duplicate", "b")]
    assert (bal.accepted, bal.refused) == (3, 1)


def test_a_rerun_after_a_lost_output_replaces_the_first_result() -> None:
    res = ok_results() + [{"id": "b", "status": "refused", "reason": "timeout",
                           "rerun": True}]  # its output lost with its node, run again
    bal = compute_balance(IDS, ["d"], CATS, res)
    assert bal.problems == [] and (bal.accepted, bal.refused) == (2, 2)
    assert [(w.kind, w.id) for w in bal.warnings] == [("unexpected_refusal", "b")]
    forged = ok_results() + [{"id": "b", "status": "refused", "reason": "x", "rerun": 1}]
    assert kinds(forged) == [("duplicate", "b")]  # only a JSON true replaces


def test_missing_id_is_named_and_the_sum_is_checked() -> None:
    res = [r for r in ok_results() if r["id"] != "c"]
    assert kinds(res) == [("missing", "c"), ("count_mismatch", None)]


def test_category_outside_the_set() -> None:
    res = ok_results()
    res[0]["category"] = "poetry"
    bal = compute_balance(IDS, ["d"], CATS, res)
    assert [(p.kind, p.id) for p in bal.problems] == [("bad_category", "a")]
    assert "poetry" in bal.problems[0].detail


def test_refusal_without_reason_and_bad_status_and_bad_id() -> None:
    res = ok_results()
    res[3]["reason"] = "  "
    res[2]["status"] = "maybe"
    res.append({"status": "accepted"})
    got = kinds(res)
    assert ("no_reason", "d") in got and ("bad_status", "c") in got
    assert ("bad_id", None) in got and ("missing", "c") in got


def test_expected_refusal_that_was_accepted_is_a_problem() -> None:
    res = ok_results()
    res[3] = {"id": "d", "status": "accepted", "category": "x"}
    assert kinds(res) == [("unexpected_accept", "d")]


def test_unexpected_refusal_is_a_warning_not_a_problem() -> None:
    res = ok_results()
    res[0] = {"id": "a", "status": "refused", "reason": "too short"}
    bal = compute_balance(IDS, ["d"], CATS, res)
    assert bal.ok and [(w.kind, w.id) for w in bal.warnings] == [("unexpected_refusal", "a")]


def test_expected_count_differs_from_inputs_found() -> None:
    bal = compute_balance(IDS, ["d"], CATS, ok_results(), expected_count=5)
    assert not bal.ok and {p.kind for p in bal.problems} == {"count_mismatch"}
    assert "4 inputs found, expected_count is 5" in bal.summary()
    assert "accepted 3 + refused 1 = 4, expected 5" in bal.summary()
