"""The runner's ``balance`` event, type-checked where the bot takes it in.

The event is written by the node, and once a team's code ran there, by the team: a forged
one put HTML in ``total`` and hid the report's FAILS marks (issue 32). Its counts must be
non-negative integers, ``ok`` a boolean, ``problems`` and ``sample`` lists of objects,
``by_category`` a mapping of names to counts. Otherwise the balance is flagged
(``malformed``: what is wrong), not ok, and nothing of the node's figures is kept to be
drawn: the bot's own recount from the item events it recorded stands beside the flag.
"""

from __future__ import annotations

from typing import Any

from bot.pilot.record import Run

COUNTS = ("accepted", "refused", "total")


def is_count(value: Any) -> bool:
    """A non-negative integer (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: Any) -> str:
    return repr(value)[:80]


def balance_problems(raw: Any) -> list[str]:
    """What is wrong with the types of a balance event's data ([] when nothing is)."""
    if not isinstance(raw, dict):
        return [f"the balance event is {_shown(raw)}, not a JSON object"]
    found = [f"{k} is {_shown(raw.get(k))}, not a non-negative integer" for k in COUNTS
             if not is_count(raw.get(k))]
    if "forgotten_pending" in raw and not is_count(raw.get("forgotten_pending")):
        found.append(f"forgotten_pending is {_shown(raw.get('forgotten_pending'))}, not a "
                     "non-negative integer")
    if not isinstance(raw.get("ok"), bool):
        found.append(f"ok is {_shown(raw.get('ok'))}, not true or false")
    for key in ("problems", "warnings", "sample"):
        value = raw.get(key)
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, dict) for v in value)):
            found.append(f"{key} is not a list of objects")
    by_cat = raw.get("by_category")
    if by_cat is not None and not (isinstance(by_cat, dict)
                                   and all(is_count(v) for v in by_cat.values())):
        found.append("by_category is not a mapping of categories to counts")
    return found


def checked_balance(raw: Any) -> dict[str, Any] | None:
    """The event's data as it came when its types hold; else the flagged balance: not ok,
    ``malformed`` saying why, none of the node's figures kept."""
    if raw is None:
        return None
    problems = balance_problems(raw)
    if not problems:
        return dict(raw)
    return {"ok": False, "malformed": problems,
            "problems": [{"kind": "malformed", "id": "", "detail": p} for p in problems]}


NODE_LISTED = ("node-listed: the inputs it expects were listed by the head node "
               "(volume.nodes[0]) and their outcomes reported by the same nodes; the bot "
               "holds no copy of the corpus to check either against")


def node_listed(run: Run) -> bool:
    """A volume run whose corpus only the nodes hold (``volume.inputs.on_nodes`` without
    ``dir``): its balance is the nodes' word on both sides, and is said to be."""
    volume = run.manifest.volume if run.manifest is not None else None
    return run.kind == "volume" and volume is not None and bool(volume.inputs.on_nodes) \
        and volume.inputs.dir is None
