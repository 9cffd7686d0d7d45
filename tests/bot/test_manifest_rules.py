"""Table tests: one row per rule of the manifest, refused at the right field path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bot.manifest_helpers import dump, load, locs, make_project, merged

_VI = {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": 12}
_SSH_A = {"kind": "ssh", "host": "gpu-a.example", "workdir": "/srv/p"}
_SSH_A2 = {"kind": "ssh", "host": "GPU-A.example", "port": 22, "workdir": "/srv/q"}
_SSH_B = {"kind": "ssh", "host": "gpu-b.example", "workdir": "/srv/p"}

REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("days 5", {"hardware": {"days": 5}}, "hardware.days", "3, 7 or 30"),
    ("lots 11", {"hardware": {"lots": 11}}, "hardware.lots", "10"),
    ("lots 0", {"hardware": {"lots": 0}}, "hardware.lots", "1"),
    ("negative price", {"hardware": {"lot_price_usd_per_day": "-1"}},
     "hardware.lot_price_usd_per_day", "0"),
    ("price nan", {"hardware": {"lot_price_usd_per_day": "NaN"}},
     "hardware.lot_price_usd_per_day", ""),
    ("mi300x with cuda", {"hardware": {"gpu": "MI300X"}}, "backend", "rocm only"),
    ("h100 with rocm", {"backend": "rocm"}, "backend", "cuda only"),
    ("cpu model with cuda", {"hardware": {"gpu": "cpu"}}, "backend", "cpu only"),
    ("h100 proven on cpu", {"backend": "cpu"}, "backend", "on its card"),
    ("unknown gpu", {"hardware": {"gpu": "RTX9999"}}, "hardware.gpu", "MI300X"),
    ("api version", {"apiVersion": "preflight/v2"}, "apiVersion", "preflight/v1"),
    ("name not a slug", {"name": "My Pilot"}, "name", "slug"),
    ("backend unknown", {"backend": "metal"}, "backend", "cuda"),
    ("preparation unknown", {"preparation": "conda"}, "preparation", "pytorch"),
    ("expected count", {"inputs": {"expected_count": 11}}, "inputs.expected_count",
     "found 12"),
    ("refusal missing", {"inputs": {"expected_refusals": ["doc-99"]}},
     "inputs.expected_refusals[0]", "doc-99"),
    ("refusal with extension", {"inputs": {"expected_refusals": ["doc-07.txt"]}},
     "inputs.expected_refusals[0]", "did you mean 'doc-07'"),
    ("refusal twice", {"inputs": {"expected_refusals": ["doc-07", "DOC-07"]},
                       "success": {"min_accepted": 10, "max_refused": 2}},
     "inputs.expected_refusals[1]", "unique"),
    ("inputs dir missing", {"inputs": {"dir": "nowhere"}}, "inputs.dir", "not a directory"),
    ("project dir missing", {"project": {"dir": "../nowhere-at-all"}}, "project.dir",
     "not a directory"),
    ("requirements missing", {"project": {"requirements": "req.txt"}},
     "project.requirements", "not found"),
    ("pattern escapes", {"inputs": {"pattern": "../*"}}, "inputs.pattern", "directly in"),
    ("pattern in a subfolder", {"inputs": {"pattern": "sub/*.txt"}}, "inputs.pattern",
     "directly in"),
    ("recursive pattern", {"inputs": {"pattern": "doc-**a.txt"}}, "inputs.expected_count",
     "found 0"),
    ("no categories", {"task": {"categories": []}}, "task.categories", "at least one"),
    ("duplicate category", {"task": {"categories": ["invoice", "Invoice"]}},
     "task.categories[1]", "unique"),
    ("handler and command", {"task": {"command": ["python", "x.py"]}}, "task.command",
     "not both"),
    ("neither handler nor command", {"task": {"handler": None}}, "task.handler", "give"),
    ("handler not an entry point", {"task": {"handler": "classify.py"}}, "task.handler",
     "module:function"),
    ("min_accepted too high", {"success": {"min_accepted": 12}}, "success.min_accepted",
     "11 can be accepted"),
    ("max_refused below refusals", {"success": {"max_refused": 0}}, "success.max_refused",
     "never pass"),
    ("two_person without approvers", {"approvals": {"two_person": True}},
     "approvals.approvers", "two_person"),
    ("ssh without host", {"node": {"kind": "ssh", "workdir": "/srv/p"}}, "node.host",
     "node.host"),
    ("bad fingerprint", {"node": {"host_key_fingerprint": "MD5:aa"}},
     "node.host_key_fingerprint", "SHA256"),
    ("unknown stage timeout", {"diagnostics": {"timeouts": {"warmup": 3}}},
     "diagnostics.timeouts", "warmup"),
    ("zero timeout", {"diagnostics": {"timeouts": {"pilot": 0}}},
     "diagnostics.timeouts.pilot", "greater than 0"),
    ("bad python constraint", {"project": {"python": "3.10 please"}}, "project.python",
     ">=3.10"),
    ("naive lease start", {"lease": {"starts_at": "2030-01-01T00:00:00"}}, "lease.starts_at",
     "timezone"),
    ("slack bot token", {"project": {"params": {"notify": "xoxb-123456789-abcdefghij"}}},
     "project.params.notify", "Slack token"),
    ("password key", {"task": {"params": {"db_password": "hunter2"}}},
     "task.params.db_password", "environment"),
    ("aws key", {"task": {"params": {"bucket_key": "AKIAIOSFODNN7EXAMPLE"}}},
     "task.params.bucket_key", "AWS"),
    ("url with credentials", {"results": {"copy_to": "https://bob:pw@example.net/e"}},
     "results.copy_to", "user and password"),
    ("pem block", {"project": {"params": {"key": "-----BEGIN RSA PRIVATE KEY-----\nMII"}}},
     "project.params.key", "PEM"),
    ("volume count", {"volume": {"inputs": {"dir": "data/pilote", "expected_count": 3}}},
     "volume.inputs.expected_count", "found 12"),
    ("own workload mistyped", {"task": {"handler": "runner.workloads.clasify:handle"}},
     "task.handler", "did you mean 'runner.workloads.classify'"),
    ("own workload function mistyped", {"task": {"handler": "runner.workloads.classify:handel"}},
     "task.handler", "did you mean 'handle'?"),
    ("volume dir mistyped on this machine", {"volume": {"inputs": {"dir": "data/pilotee",
                                                                    "expected_count": 12}}},
     "volume.inputs.dir", "is not a directory"),
    ("volume dir mistyped on local nodes", {"volume": {"inputs": {"dir": "corpsu",
                                                                  "expected_count": 12},
                                                       "nodes": [{"kind": "local"}]}},
     "volume.inputs.dir", "is not a directory"),
    ("volume without inputs", {"volume": {"cards_per_worker": 1}}, "volume.inputs",
     "missing"),
    ("volume node twice", {"hardware": {"lots": 2},
                           "volume": {"inputs": _VI, "nodes": [_SSH_A, _SSH_B, _SSH_A2]}},
     "volume.nodes[2]", "listed twice"),
    ("volume ssh node without host", {"volume": {"inputs": _VI, "nodes": [{"kind": "ssh"}]}},
     "volume.nodes[0].host", "needs a host"),
    ("volume local and ssh", {"hardware": {"lots": 2},
                              "volume": {"inputs": _VI, "nodes": [_SSH_A, {"kind": "local"}]}},
     "volume.nodes[1].kind", "not both"),
    ("volume more nodes than cards", {"volume": {"inputs": _VI, "nodes": [_SSH_A, _SSH_B]}},
     "volume.nodes", "at least one card"),
    ("volume worker larger than a node", {"hardware": {"gpu": "B200", "lots": 2},
                                          "volume": {"inputs": _VI, "cards_per_worker": 3,
                                                     "nodes": [_SSH_A, _SSH_B]}},
     "volume.cards_per_worker", "no worker could start"),
    ("volume nodes as a count above 1", {"volume": {"inputs": _VI, "nodes": 2}},
     "volume.nodes", "list them"),
    ("volume nodes empty", {"volume": {"inputs": _VI, "nodes": []}}, "volume.nodes",
     "empty list"),
    ("volume batch 0", {"volume": {"inputs": _VI, "batch_size": 0}}, "volume.batch_size",
     "greater than or equal to 1"),
    ("volume prefetch negative", {"volume": {"inputs": _VI, "prefetch": -1}},
     "volume.prefetch", "greater than or equal to 0"),
    ("volume prefetch too deep", {"volume": {"inputs": _VI, "prefetch": 9}},
     "volume.prefetch", "less than or equal to 4"),
    ("volume prefetch yes", {"volume": {"inputs": _VI, "prefetch": True}},
     "volume.prefetch", "valid integer"),
    ("volume prefetch in MB", {"volume": {"inputs": _VI, "prefetch": "256MB"}},
     "volume.prefetch", "valid integer"),
    ("volume node unknown key", {"volume": {"inputs": _VI, "nodes": [{"kind": "ssh",
                                                                       "hots": "a"}]}},
     "volume.nodes[0].hots", "unknown key"),
    ("lots yes", {"hardware": {"lots": True}}, "hardware.lots", "found True"),
    ("lots quoted", {"hardware": {"lots": "3"}}, "hardware.lots", "valid integer"),
    ("lots 2.5", {"hardware": {"lots": 2.5}}, "hardware.lots", "valid integer"),
    ("expected_count true", {"inputs": {"expected_count": True}}, "inputs.expected_count",
     "valid integer"),
    ("estimate yes", {"hardware": {"memory_estimate_gib": True}},
     "hardware.memory_estimate_gib", "valid number"),
    ("price beyond reason", {"hardware": {"lot_price_usd_per_day": "1e30"}},
     "hardware.lot_price_usd_per_day", "1000000"),
    ("price with 7 decimals", {"hardware": {"lot_price_usd_per_day": "2.5000001"}},
     "hardware.lot_price_usd_per_day", "6 decimal places"),
    ("hugging face token", {"task": {"params": {"hub": "hf_" + "aBcDeFgHiJ" * 4}}},
     "task.params.hub", "Hugging Face"),
    ("exclude leaving the project", {"project": {"exclude": ["data/../../x"]}},
     "project.exclude", "without '..'"),
    ("exclude absolute", {"project": {"exclude": ["/etc"]}}, "project.exclude",
     "relative to project.dir"),
    ("exclude holding the inputs", {"project": {"exclude": ["ok", "data"]}},
     "project.exclude[1]", "holds inputs.dir"),
    ("exclude the inputs themselves", {"project": {"exclude": ["data/pilote"]}},
     "project.exclude[0]", "holds inputs.dir"),
    ("exclude the volume's corpus", {"project": {"exclude": ["corpus"]},
                                     "volume": {"inputs": {"dir": "corpus",
                                                           "expected_count": 9000},
                                                "nodes": [_SSH_A]}},
     "project.exclude[0]", "holds volume.inputs.dir"),
]


@pytest.mark.parametrize("label, change, loc, fragment", REFUSED, ids=[r[0] for r in REFUSED])
def test_rule_refuses(tmp_path: Path, label: str, change: dict[str, Any], loc: str,
                      fragment: str) -> None:
    make_project(tmp_path)
    found = locs(tmp_path, dump(merged(**change)))
    assert loc in found, f"{label}: {sorted(found)}"
    assert fragment.lower() in found[loc].message.lower()
    assert found[loc].line is not None


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("gpu case-insensitive", {"hardware": {"gpu": "h100"}}),
    ("mi300x with rocm", {"hardware": {"gpu": "MI300X"}, "backend": "rocm"}),
    ("cpu model", {"hardware": {"gpu": "cpu", "lot_price_usd_per_day": 0}, "backend": "cpu"}),
    ("price as number", {"hardware": {"lot_price_usd_per_day": 3}}),
    ("b200", {"hardware": {"gpu": "B200", "lots": 3}}),
    ("days 30, lots 10", {"hardware": {"days": 30, "lots": 10}}),
    ("training without categories", {"purpose": "training",
                                     "task": {"kind": "train", "categories": []}}),
    ("command instead of handler", {"task": {"handler": None, "command": ["python", "x.py"]}}),
    ("min_accepted exactly reachable", {"success": {"min_accepted": 11}}),
    ("no refusals", {"inputs": {"expected_refusals": []}, "success": {"max_refused": 0}}),
    ("password from the environment", {"task": {"params": {"password": "${DB_PASSWORD}"}}}),
    ("two_person with approvers", {"approvals": {"approvers": ["a", "b"], "two_person": True}}),
    ("volume dir elsewhere", {"volume": {"inputs": {"dir": "corpus", "expected_count": 9000},
                                         "batch_size": 64, "nodes": [_SSH_A]}}),
    ("volume on two B200 nodes", {"hardware": {"gpu": "B200", "lots": 2},
                                  "volume": {"inputs": _VI, "cards_per_worker": 2,
                                             "nodes": [_SSH_A, _SSH_B]}}),
    ("same host, two ports", {"hardware": {"lots": 2},
                              "volume": {"inputs": _VI,
                                         "nodes": [_SSH_A, {**_SSH_A, "port": 2222}]}}),
    ("aware lease start", {"lease": {"starts_at": "2030-01-01T00:00:00+02:00"}}),
    ("volume without read ahead", {"volume": {"inputs": _VI, "prefetch": 0}}),
    ("timeouts of known stages", {"diagnostics": {"timeouts": {"pilot": 60, "torch": 5}}}),
    ("integer estimate", {"hardware": {"memory_estimate_gib": 40}}),
    ("largest price", {"hardware": {"lot_price_usd_per_day": "1000000"}}),
    ("tokenizer settings", {"task": {"params": {"pad_token": "<pad>", "eos_token": "</s>"}}}),
    ("exclude a data folder beside the inputs", {"project": {"exclude": ["data/corpus",
                                                                         "ckpt/last.pt"]}}),
]


@pytest.mark.parametrize("label, change", ACCEPTED, ids=[r[0] for r in ACCEPTED])
def test_rule_accepts(tmp_path: Path, label: str, change: dict[str, Any]) -> None:
    make_project(tmp_path)
    load(tmp_path, dump(merged(**change)))


def test_ids_collide_case_insensitively(tmp_path: Path) -> None:
    make_project(tmp_path, names=["doc-01.txt", "DOC-01.md", "doc-02.txt"])
    text = dump(merged(inputs={"pattern": "*", "expected_count": 3, "expected_refusals": []},
                       success=None))
    problem = locs(tmp_path, text)["inputs.pattern"]
    assert "doc-01.txt" in problem.message and "DOC-01.md" in problem.message


def test_same_stem_different_extension_collides(tmp_path: Path) -> None:
    make_project(tmp_path, names=["a.txt", "a.pdf"])
    text = dump(merged(inputs={"pattern": "*", "expected_count": 2, "expected_refusals": []},
                       success=None))
    assert "have the same id 'a'" in locs(tmp_path, text)["inputs.pattern"].message


def test_warnings_for_nuances(tmp_path: Path) -> None:
    make_project(tmp_path)
    rocm = load(tmp_path, dump(merged(hardware={"gpu": "MI300X"}, backend="rocm",
                                      diagnostics={"extensions": ["flash_attn", "triton"]})))
    assert "flash_attn" in {w.loc: w for w in rocm.warnings}["diagnostics.extensions"].message
    b200 = load(tmp_path, dump(merged(hardware={"gpu": "B200"})))
    assert "two cards" in {w.loc: w for w in b200.warnings}["hardware.gpu"].message
    ubuntu = load(tmp_path, dump(merged(preparation="ubuntu")))
    assert "project.requirements" in {w.loc for w in ubuntu.warnings}
    single = load(tmp_path, dump(merged(approvals={"approvers": ["a"], "two_person": True})))
    assert "approvals.approvers" in {w.loc for w in single.warnings}


def test_volume_dir_missing_on_ssh_nodes_is_only_a_warning(tmp_path: Path) -> None:
    make_project(tmp_path)
    loaded = load(tmp_path, dump(merged(volume={"inputs": {"dir": "corpus",
                                                           "expected_count": 5},
                                                "nodes": [_SSH_A]})))
    [warning] = [w for w in loaded.warnings if w.loc == "volume.inputs.dir"]
    assert "checked again before an approval is recorded" in warning.message


def test_volume_defaults_to_the_pilot_node_and_cpu_ignores_cards_per_worker(
        tmp_path: Path) -> None:
    make_project(tmp_path)
    loaded = load(tmp_path, dump(merged(volume={"inputs": _VI})))
    volume = loaded.manifest.volume
    assert volume is not None and volume.nodes is None and volume.cards_per_worker == 1
    assert volume.batch_size is None
    cpu = load(tmp_path, dump(merged(hardware={"gpu": "cpu", "lot_price_usd_per_day": 0},
                                     backend="cpu",
                                     volume={"inputs": _VI, "cards_per_worker": 2})))
    assert "ignored" in {w.loc: w for w in cpu.warnings}["volume.cards_per_worker"].message
    older = load(tmp_path, dump(merged(volume={"inputs": _VI, "nodes": 1})))
    assert "older form" in {w.loc: w for w in older.warnings}["volume.nodes"].message


def test_every_volume_problem_is_named_at_once(tmp_path: Path) -> None:
    make_project(tmp_path)
    found = locs(tmp_path, dump(merged(hardware={"lots": 3}, volume={
        "inputs": _VI, "nodes": [_SSH_A, {"kind": "ssh"}, _SSH_A2]})))
    assert {"volume.nodes[1].host", "volume.nodes[2]"} <= set(found)
    assert found["volume.nodes[2]"].line is not None
