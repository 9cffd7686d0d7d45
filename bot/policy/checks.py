"""The policy's rules as pure functions: may this person do this, from this origin?

Each check returns the refusals it finds (empty: allowed). A refusal names the rule, says
what was asked and where the rule is configured, so the person refused knows whom to ask.
Paths are resolved (``..`` and symlinks) before they are compared with the roots; nothing
here reads a file's content.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.manifest.nodes import node_model
from bot.manifest.source import SourceMap, format_loc
from bot.pilot.leases import lease_key
from bot.pilot.plan import Plan
from bot.pilot.record import Run
from bot.policy.load import Policy
from bot.policy.model import Origin, parse_node_entry

LEASE_GATES = ("funds-confirmed", "provisioned")
# Manifest paths relative to project.dir: (field path, read by the bot or the runner)
_PROJECT_PATHS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("project", "requirements"), True), (("inputs", "dir"), True),
    (("volume", "inputs", "dir"), True), (("results", "copy_to"), False),
    (("results", "runs_dir"), False))


@dataclass(frozen=True)
class Identity:
    """Who asks: a Slack user id (or the terminal's user), the user groups they are in, and
    the channel the request comes from (None: the terminal, or no channel)."""

    user: str
    groups: frozenset[str] = frozenset()
    channel: str | None = None

    def ids(self) -> frozenset[str]:
        return self.groups | {self.user}


@dataclass(frozen=True)
class Refusal:
    rule: str
    message: str
    where: str

    def __str__(self) -> str:
        return f"{self.message} (rule `{self.rule}`, set in {self.where})"

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message, "where": self.where}


def holds(policy: Policy, role: str, who: Identity) -> bool:
    """Whether ``who`` holds ``role`` (admins hold every role; unset submitters: anyone)."""
    roles = policy.file.roles
    members: list[str] | None = getattr(roles, role)
    if role == "submitters" and members is None:
        return True
    return bool(who.ids() & {*(members or []), *roles.admins})


def group_ids(policy: Policy) -> list[str]:
    """The Slack user group ids (S…) named by any role."""
    roles = policy.file.roles
    named = [*(roles.submitters or []), *roles.approvers, *roles.lease_operators, *roles.admins]
    return sorted({n for n in named if n.startswith("S")})


def approver_pool(policy: Policy) -> frozenset[str]:
    """Everyone the bot lets approve: the policy's approvers and admins, PREFLIGHT_APPROVERS."""
    roles = policy.file.roles
    return frozenset({*roles.approvers, *roles.admins, *policy.extra_approvers})


def effective_approvers(policy: Policy, named: Sequence[str], origin: Origin) -> list[str]:
    """Who may approve a run: from Slack the manifest's list (already checked to be inside
    the pool), or the whole pool when it names nobody; from the CLI as before (the manifest's
    list plus PREFLIGHT_APPROVERS)."""
    if origin == "slack":
        return sorted(set(named)) if named else sorted(approver_pool(policy))
    return sorted({*named, *policy.extra_approvers})


def two_person(policy: Policy, manifest_says: bool) -> bool:
    return manifest_says or policy.file.approvals.two_person


# -- submit ---------------------------------------------------------------------------
def check_submission(policy: Policy, data: Any, marks: SourceMap, *, origin: Origin,
                     who: Identity, base_dir: Path) -> list[Refusal]:
    """Refusals for a manifest (its raw parsed data, so an invalid manifest cannot slip
    past), before anything on disk is looked at."""
    data = data if isinstance(data, dict) else {}
    out: list[Refusal] = []
    if origin == "slack":
        if not holds(policy, "submitters", who):
            out.append(Refusal("roles.submitters", f"<@{who.user}> may not submit pilots from "
                               "Slack", policy.where("roles.submitters")))
        out += check_nodes(policy, data, marks)
        out += _check_approvers(policy, data, marks)
        out += _check_corpus_on_nodes(policy, data, marks)
    out += _check_paths(policy, data, marks, origin=origin, base_dir=base_dir, who=who)
    return out


def _section(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)  # type: ignore[assignment]
    return data


def _at(marks: SourceMap, loc: Sequence[Any]) -> str:
    line, _ = marks.locate(loc)
    return format_loc(loc) + (f" (line {line})" if line else "")


def run_nodes(data: dict[str, Any]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every node a run of this manifest may use, with its field path: the pilot's ``node``
    and each ``volume.nodes[i]`` (a volume without a list runs on the pilot's node)."""
    node = _section(data, "node")
    out: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("node",), node if isinstance(node, dict) else {})]
    listed = _section(data, "volume", "nodes")
    for index, entry in enumerate(listed if isinstance(listed, list) else []):
        out.append((("volume", "nodes", index), entry if isinstance(entry, dict) else {}))
    return out


def check_nodes(policy: Policy, data: dict[str, Any], marks: SourceMap) -> list[Refusal]:
    """From Slack: each node a run may use (pilot, volume) is one the policy allows, and a
    program the manifest names (``task.command``, ``blender.executable``) passes the gate
    of every one of those nodes, by its kind and whether it is listed."""
    data = data if isinstance(data, dict) else {}
    allowed = ([parse_node_entry(n) for n in policy.file.nodes]
               if policy.file.nodes is not None else None)
    out: list[Refusal] = []
    judged: list[tuple[tuple[Any, ...], Any, bool]] = []
    for loc, node in run_nodes(data):
        refusals, listed = _check_one_node(policy, allowed, loc, node, marks)
        out += refusals
        judged.append((loc, _remote(node), listed))
    programs: list[tuple[str, ...]] = []
    if _section(data, "task", "command") is not None:
        programs.append(("task", "command"))
    executable = _section(data, "blender", "executable")
    if isinstance(executable, str) and executable != "blender":
        # A program the manifest names, run on the node: the same gate as task.command.
        programs.append(("blender", "executable"))
    for program in programs:
        seen: set[str] = set()
        for loc, remote, listed in judged:
            for refusal in _check_command(policy, remote, listed, marks, program, loc):
                if refusal.rule not in seen:  # one line per rule: the first node that fails
                    seen.add(refusal.rule)
                    out.append(refusal)
    return out


def _check_one_node(policy: Policy, allowed: list[tuple[str | None, str, str | None]] | None,
                    loc: tuple[Any, ...], node: dict[str, Any],
                    marks: SourceMap) -> tuple[list[Refusal], bool]:
    out: list[Refusal] = []
    listed = False
    entry: tuple[str | None, str, str | None] | None = None
    if _remote(node) is False:
        listed = allowed is not None and any(k == "local" for _, k, _ in allowed)
        if not listed:
            out.append(Refusal("nodes", f"{_at(marks, (*loc, 'kind'))}: `local` runs on the "
                               "bot host itself, which a Slack manifest may not name",
                               policy.where("nodes")))
    elif isinstance(node.get("host"), str):
        port = node.get("port", 22)
        key = lease_key(node["host"], port if isinstance(port, int) else 22)
        user = node.get("user") if isinstance(node.get("user"), str) else None
        matches = [e for e in allowed or [] if e[1] == key and e[0] in (None, user)]
        listed = bool(matches)
        entry = matches[0] if matches else None
        if allowed is not None and not listed:
            out.append(Refusal("nodes", f"{_at(marks, (*loc, 'host'))}: node "
                               f"{(user + '@') if user else ''}{key} is not one the bot may "
                               "use from Slack", policy.where("nodes")))
    pin = node.get("host_key_fingerprint")
    if isinstance(pin, str) and (entry is None or entry[2] != pin):
        # The pin replaces known_hosts: from Slack only the policy's own pin for that node.
        out.append(Refusal("nodes", f"{_at(marks, (*loc, 'host_key_fingerprint'))}: a host "
                           "key from a Slack manifest is accepted only when the policy's "
                           "`nodes` entry for that node pins the same key "
                           "(\"USER@HOST:PORT SHA256:…\"); otherwise known_hosts decides",
                           policy.where("nodes")))
    return out, listed


def _remote(node: dict[str, Any]) -> bool | None:
    """Whether a node section (not validated yet) names another machine, by its kind's
    model; None for a kind that is not one (the manifest's rules refuse it)."""
    model = node_model(node)
    return None if model is None else model.is_remote


def _check_command(policy: Policy, remote: bool | None, listed: bool, marks: SourceMap,
                   loc: tuple[str, ...] = ("task", "command"),
                   node: tuple[Any, ...] = ("node",)) -> list[Refusal]:
    at = _at(marks, loc)
    on = "" if node == ("node",) else f" ({format_loc(node)})"
    if remote is False and not policy.file.task_command.local:
        return [Refusal("task_command.local", f"{at}: an external command on the bot host"
                        f"{on} is not allowed from Slack", policy.where("task_command.local"))]
    if remote and not (policy.file.task_command.ssh and listed):
        why = "is off" if not policy.file.task_command.ssh else "is only for nodes listed in nodes"
        return [Refusal("task_command.ssh", f"{at}: an external command from Slack{on} {why}",
                        policy.where("task_command.ssh" if not policy.file.task_command.ssh
                                     else "nodes"))]
    return []


def _check_approvers(policy: Policy, data: dict[str, Any], marks: SourceMap) -> list[Refusal]:
    named = _section(data, "approvals", "approvers")
    pool = approver_pool(policy)
    out: list[Refusal] = []
    for index, approver in enumerate(named if isinstance(named, list) else []):
        if isinstance(approver, str) and approver not in pool:
            out.append(Refusal("roles.approvers", f"{_at(marks, ('approvals', 'approvers', index))}"
                               f": {approver!r} is not an approver in the bot's policy (a "
                               "manifest can only narrow the policy's approvers)",
                               policy.where("roles.approvers")))
    return out


def _check_paths(policy: Policy, data: dict[str, Any], marks: SourceMap, *, origin: Origin,
                 base_dir: Path, who: Identity) -> list[Refusal]:
    project = _section(data, "project", "dir")
    project_dir = _resolve(base_dir, project if isinstance(project, str) else ".")
    if project_dir is None:
        project_dir = Path("/nonexistent/unresolvable")  # its own refusal below says why
    if origin == "slack":
        roots, key = policy.roots_for(who.channel, who.groups)
        where, rule = policy.where(key), _roots_rule(key)
        wanted: list[tuple[tuple[str, ...], Path | None]] = [
            (("project", "dir"), _resolve(base_dir, project if isinstance(project, str)
                                          else "."))]
    else:  # the terminal: the manifest's directory tree and the project it names
        roots, where = (base_dir.resolve(), project_dir), "the CLI's rule (no policy key)"
        rule = "project_roots"
        wanted = []
    for loc, read in _PROJECT_PATHS:
        value = _section(data, *loc)
        if not isinstance(value, str) or (origin == "cli" and not read):
            continue
        if loc[-1] == "copy_to" and "://" in value and not value.startswith("file:"):
            continue  # a remote destination, not a path on this host
        wanted.append((loc, _resolve(project_dir, value.removeprefix("file://"))))
    # The message says what was written, never where a link leads (that would tell a
    # Slack member about the bot host's files).
    return [Refusal(rule, f"{_at(marks, loc)}: {_written(data, loc)} "
                    + ("resolves outside" if path is not None else "cannot be resolved within")
                    + f" the project roots ({', '.join(map(str, roots))})", where)
            for loc, path in wanted if path is None or not inside(path, roots)]


def _check_corpus_on_nodes(policy: Policy, data: dict[str, Any],
                           marks: SourceMap) -> list[Refusal]:
    """A corpus already on the nodes (``volume.inputs.on_nodes``) is a path on the nodes,
    not on the bot host: from Slack only under one of ``node_corpus_roots``, never with
    ``..`` (the files there are checked against the bot's copy, never uploaded)."""
    loc = ("volume", "inputs", "on_nodes")
    value = _section(data, *loc)
    if value is None:
        return []
    roots = policy.file.node_corpus_roots
    where = policy.where("node_corpus_roots")
    if not roots:
        return [Refusal("node_corpus_roots", f"{_at(marks, loc)}: a corpus already on the "
                        "nodes may not be named from Slack: the policy lists no "
                        "node_corpus_roots", where)]
    text = value if isinstance(value, str) else ""
    path = posixpath.normpath(text) if text.startswith("/") else ""
    if not path or ".." in text.split("/") or not any(
            path == root.rstrip("/") or path.startswith(root.rstrip("/") + "/")
            for root in roots):
        return [Refusal("node_corpus_roots", f"{_at(marks, loc)}: {value!r} is not under the "
                        f"node corpus roots ({', '.join(roots)})", where)]
    return []


def _roots_rule(key: str) -> str:
    return "project_roots" if key == "project_roots" else "team_roots"


def _written(data: dict[str, Any], loc: tuple[str, ...]) -> str:
    value = _section(data, *loc)
    return repr(value) if isinstance(value, str) else "'.' (the default)"


def check_files(policy: Policy, files: Iterable[Path], what: str,
                who: Identity | None = None) -> list[Refusal]:
    """Files a Slack run would read (inputs, parameter files): a symlink leading out of the
    roots (``who``'s: their channel's or group's) is refused like a path written outside."""
    roots, key = policy.roots_for(who.channel, who.groups) if who else (policy.roots,
                                                                         "project_roots")
    for file in files:
        try:
            target: Path | None = Path(file).resolve()
        except (OSError, RuntimeError, ValueError):  # a link loop
            target = None
        if target is None or not inside(target, roots):
            return [Refusal(_roots_rule(key), f"{what} {Path(file).name!r} is a link leading "
                            f"outside the project roots ({', '.join(map(str, roots))})",
                            policy.where(key))]
    return []


def inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _resolve(base: Path, value: str) -> Path | None:
    """``value`` from ``base``, ``..`` and symlinks resolved; None when it cannot be (a NUL
    byte, a link loop): such a path is refused, never guessed."""
    try:
        return Path(os.path.join(base, os.path.expanduser(value) if value.startswith("~")
                                 else value)).resolve()
    except (OSError, RuntimeError, ValueError):
        return None


# -- approve --------------------------------------------------------------------------
def check_approval(policy: Policy, run: Run, who: Identity,
                   origin: Origin) -> list[Refusal]:
    """From Slack: the approver must be in the policy's pool, and a pilot above the spending
    caps needs an admin. (The CLI's ``--by`` is self-declared: it is not role-checked.)"""
    if origin != "slack":
        return []
    if not who.ids() & approver_pool(policy):
        return [Refusal("roles.approvers", f"<@{who.user}> is not an approver in the bot's "
                        "policy", policy.where("roles.approvers"))]
    over = over_caps(policy, run.plan)
    if over and not holds(policy, "admins", who):
        key, text = over[0]
        return [Refusal(f"spending.{key}", f"{text}: approving it needs an admin",
                        policy.where(f"spending.{key}"))]
    return []


# -- stop, revise, fix-env, and every button ------------------------------------------
def check_run_action(policy: Policy, run: Run, who: Identity, origin: Origin,
                     action: str) -> list[Refusal]:
    """From Slack a run is acted on only from the channel it belongs to, and ``stop``,
    ``revise`` and ``fix-env`` only by its submitter, an approver (the policy's or the
    run's) or an admin; ``approve`` keeps its own stricter rule (``check_approval``). The
    terminal's ``--by`` is self-declared: not checked."""
    if origin != "slack":
        return []
    if run.channel != who.channel:
        return [Refusal("channel", f"run {run.id} belongs to another channel: it may only "
                        f"be acted on ({action}) from the channel it was submitted in",
                        "the run's own channel (fixed when it was submitted)")]
    if action == "approve":
        return []
    if who.user == run.submitter or holds(policy, "admins", who) or \
            who.ids() & {*approver_pool(policy), *run.approvers}:
        return []
    return [Refusal("roles.approvers", f"<@{who.user}> may not {action} run {run.id}: only "
                    f"its submitter <@{run.submitter}>, an approver or an admin may",
                    policy.where("roles.approvers"))]


def over_caps(policy: Policy, plan: Plan | None) -> list[tuple[str, str]]:
    """The spending caps a plan exceeds: (key, what), in the order of the file (none for a
    run recorded without a plan)."""
    caps = policy.file.spending
    out: list[tuple[str, str]] = []
    if plan is None:
        return out
    lots, days, total = plan.lots, plan.days, plan.total_usd
    if caps.max_lots is not None and lots > caps.max_lots:
        out.append(("max_lots", f"{lots} lots is above the cap of {caps.max_lots}"))
    if caps.max_days is not None and days > caps.max_days:
        out.append(("max_days", f"{days} days is above the cap of {caps.max_days}"))
    if caps.max_total_usd is not None and total > caps.max_total_usd:
        out.append(("max_total_usd", f"{total} USD is above the cap of {caps.max_total_usd} USD"))
    return out


# -- leases ---------------------------------------------------------------------------
def check_lease_change(policy: Policy, who: Identity, origin: Origin, state: str,
                       waiting: Iterable[Run]) -> list[Refusal]:
    """From Slack a lease moves only for a lease operator; ``funds-confirmed`` and
    ``provisioned`` are never recorded by the submitter of a two-person pilot waiting on
    the node (the step that lets the spending start needs a second person)."""
    if origin == "slack" and not holds(policy, "lease_operators", who):
        return [Refusal("roles.lease_operators", f"<@{who.user}> may not change leases from "
                        "Slack", policy.where("roles.lease_operators"))]
    if state not in LEASE_GATES:
        return []
    for run in waiting:
        if run.submitter == who.user and run.two_person:
            forced = policy.file.approvals.two_person
            return [Refusal("approvals.two_person", f"{who.user} submitted run {run.id}, "
                            f"which waits on this node: with the two-person rule another "
                            f"person records {state}",
                            policy.where("approvals.two_person") if forced else
                            f"the manifest of run {run.id} (approvals.two_person)")]
    return []
