"""Attempt diffs: field by field, one factor at a time, facts without per-run noise."""

from __future__ import annotations

from bot.pilot.attempts import ADDED, REMOVED, diff_facts, diff_manifests, one_factor_warning

OLD = {"name": "p", "hardware": {"gpu": "H100", "lot_price_usd_per_day": "2.5", "lots": 1},
       "backend": "cuda", "task": {"categories": ["a", "b"], "batch_size": 8},
       "approvals": {"approvers": ["alice"]}}


def new(**change: object) -> dict[str, object]:
    import copy

    data = copy.deepcopy(OLD)
    for dotted, value in change.items():
        section, key = dotted.split("__")
        data[section][key] = value  # type: ignore[index]
    return data


def test_identical_and_equal_amounts_are_no_change() -> None:
    assert diff_manifests(OLD, new()) == []
    assert diff_manifests(OLD, new(hardware__lot_price_usd_per_day="2.50")) == []
    assert diff_manifests(OLD, new(hardware__lots=1.0)) == []


def test_one_factor_changed() -> None:
    changes = diff_manifests(OLD, new(task__batch_size=16))
    assert [(c.path, c.old, c.new) for c in changes] == [("task.batch_size", 8, 16)]
    assert one_factor_warning(changes) is None
    assert str(changes[0]) == "task.batch_size: 8 -> 16"


def test_several_factors_warn_but_price_and_approvers_do_not_count() -> None:
    changes = diff_manifests(OLD, new(task__batch_size=16, hardware__gpu="H200",
                                      approvals__approvers=["bob"]))
    assert [c.path for c in changes] == ["approvals.approvers", "hardware.gpu",
                                         "task.batch_size"]
    warning = one_factor_warning(changes)
    assert warning is not None and "2 factors" in warning and "hardware.gpu" in warning
    assert one_factor_warning(diff_manifests(OLD, new(hardware__lot_price_usd_per_day="3",
                                                      approvals__approvers=[]))) is None


def test_added_and_removed_keys() -> None:
    data = new()
    data["volume"] = {"cards_per_worker": 2}
    del data["backend"]
    changes = {c.path: c for c in diff_manifests(OLD, data)}
    assert changes["volume"].kind == ADDED and changes["backend"].kind == REMOVED
    assert changes["backend"].old == "cuda"


def test_facts_ignore_noise_and_compare_package_sets() -> None:
    old = {"interpreter": {"version": "3.11.4", "pid": 10, "duration_s": 0.1},
           "torch": {"version": "2.3.0", "cuda": "12.1"}, "compute": {"tflops": 41.2},
           "environment": {"packages": ["numpy==1.26", "torch==2.3.0"]}}
    same = {"interpreter": {"version": "3.11.4", "pid": 99, "duration_s": 0.4},
            "torch": {"version": "2.3.0", "cuda": "12.1"}, "compute": {"tflops": 40.9},
            "environment": {"packages": ["torch==2.3.0", "numpy==1.26"]}}
    assert diff_facts(old, same) == []
    moved = {**same, "torch": {"version": "2.4.0", "cuda": "12.4"},
             "environment": {"packages": ["numpy==1.26", "torch==2.4.0"]}}
    changes = {c.path: c for c in diff_facts(old, moved)}
    assert changes["torch.version"].new == "2.4.0"
    assert changes["environment.packages"].old == ["torch==2.3.0"]
    assert changes["environment.packages"].new == ["torch==2.4.0"]


def test_a_set_change_says_removed_and_added_and_run_noise_is_left_out() -> None:
    old = {"environment": {"packages": ["numpy==1.26", "torch==2.3"],
                           "log": "/runs/20261202T1-a1/runner.log",
                           "checked": "2026-12-02T10:00:01+00:00"}}
    new = {"environment": {"packages": ["numpy==2.0", "torch==2.3"],
                           "log": "/runs/20261203T9-a2/runner.log",
                           "checked": "2026-12-03T11:12:13+00:00"}}
    changes = diff_facts(old, new, ("20261202T1-a1", "20261203T9-a2"))
    assert [str(c) for c in changes] == [
        "environment.packages: removed numpy==1.26; added numpy==2.0"]


def test_per_run_noise_of_the_demo_and_a_volume_is_left_out() -> None:
    """What two runs of the same pilot on the same machine differ by (measured: the memory
    stage's RSS, the compute loop's count, the evidence's size, the disk's free space, a
    volume's Ray session) is no change; a real one still is (issue 37)."""
    old = {"prepare": {"free_disk_gib": 76.6}, "compute": {"fp32_iterations": 34},
           "memory": {"peak_rss_gib": 0.2274, "rss_before_gib": 0.2241},
           "evidence": {"bytes": 29393, "files": 18},
           "pilot": {"session": "session_2026-12-04_17-30-01_5941", "done": 12},
           "torch": {"version": "2.13.0+cpu"}}
    new = {"prepare": {"free_disk_gib": 75.9}, "compute": {"fp32_iterations": 45},
           "memory": {"peak_rss_gib": 0.2272, "rss_before_gib": 0.2239},
           "evidence": {"bytes": 29387, "files": 18},
           "pilot": {"session": "session_2026-12-04_17-31-12_6002", "done": 12},
           "torch": {"version": "2.14.0+cpu"}}
    assert [c.path for c in diff_facts(old, new)] == ["torch.version"]
