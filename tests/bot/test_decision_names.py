"""An approver's name mistyped (in --by or in the manifest) gets the closest listed name and
where the list comes from."""

from __future__ import annotations

from bot.pilot.decisions import check_decision
from tests.bot.runs import run_of

RUN = run_of(id="r-a1", name="demo", kind="pilot", status="awaiting_decision",
             outcome="passed", approvers=["alice", "U0APPROVER"], submitter="bob")


def test_a_mistyped_approver_gets_did_you_mean_and_the_list_s_place() -> None:
    refusal, _ = check_decision(RUN, "approve", "clean", "alcie")
    assert refusal is not None and "alcie is not an approver" in refusal
    assert "did you mean 'alice'?" in refusal and "approvals.approvers" in refusal


def test_a_stranger_gets_no_guess_but_the_list_s_place() -> None:
    refusal, _ = check_decision(RUN, "approve", "clean", "mallory")
    assert refusal is not None and "did you mean" not in refusal
    assert "approvals.approvers" in refusal and "PREFLIGHT_APPROVERS" in refusal


def test_settings_say_where_the_user_name_came_from() -> None:
    from bot.settings import Settings

    assert Settings.from_env({"PREFLIGHT_USER": "dana", "USER": "root"}).user_from == \
        "PREFLIGHT_USER"
    assert Settings.from_env({"USER": "root"}).user == "root"
    nobody = Settings.from_env({"USER": "", "LOGNAME": ""})
    assert (nobody.user, nobody.user_from) == ("unknown", "")
