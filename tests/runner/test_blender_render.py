"""The Blender preparation with the real ``blender`` (Debian's package; ``make test``
installs it): a tiny shipped scene rendered frame by frame with Cycles on the CPU, one
frame refused with Blender's own message, the balance exact, and a resume after SIGKILL
rendering only the frames that were missing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.blender import checks
from runner.blender.scene import make_blend
from runner.blender.stages import _check_version, device, environment
from runner.events import read_events
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from tests.processes import alive, wait_until

REPO = Path(__file__).resolve().parents[2]
BLENDER = shutil.which("blender")
pytestmark = pytest.mark.skipif(
    BLENDER is None, reason="blender not installed: these tests need the `blender` binary "
                            "(make test installs Debian's blender package)")

# A frame handler (run because blender.autoexec is on) that fails on frame 2, the way a
# missing simulation cache would: Blender prints the traceback and still saves a frame.
FAILING_HANDLER = r'''
text = bpy.data.texts.new("frame_guard.py")
text.write("""import bpy

def guard(scene, *args):
    if scene.frame_current == 2:
        raise RuntimeError("cache for frame 2 is missing: sim/cache_0002.bphys")

bpy.app.handlers.frame_change_pre.append(guard)
""")
text.use_module = True
'''
MISSING_TEXTURE = r'''
material = bpy.data.materials["Preflight"]
node = material.node_tree.nodes.new("ShaderNodeTexImage")
image = bpy.data.images.new("brick", 8, 8)
image.source = "FILE"
image.filepath = "//textures/brick_diffuse.png"
node.image = image
material.node_tree.links.new(node.outputs["Color"],
                             material.node_tree.nodes["Principled BSDF"].inputs["Base Color"])
'''


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("shots")
    (base / "frames").mkdir()
    assert BLENDER is not None
    make_blend(BLENDER, str(base / "frames" / "shot01.blend"), frames=2, samples=2,
               extra=FAILING_HANDLER)
    make_blend(BLENDER, str(base / "missing.blend"), frames=2, samples=2,
               extra=MISSING_TEXTURE)
    return base


def spec_dict(shots: Path, run_id: str, **blender: Any) -> dict[str, Any]:
    return {"run_id": run_id, "name": "render-test", "backend": "cpu",
            "preparation": "blender", "project": {"dir": str(shots)},
            "inputs": {"dir": str(shots / "frames"), "pattern": "*.blend", "frames": "1-2",
                       "expected_count": 2, "expected_refusals": ["shot01.blend#0002"]},
            "task": {"categories": ["rendered"]},
            "diagnostics": {"min_free_disk_gib": 0},
            "blender": {"autoexec": True, "samples": 2, **blender}}


def events(run: Path) -> list[dict[str, Any]]:
    return [e.to_dict() for e in read_events(str(run / "events.jsonl"))[0]]


def stage(evs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return [e for e in evs if e.get("stage") == name and e["type"] != "stage.started"][-1]


def runner(spec: Path, run: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "runner", str(spec), "--run-dir", str(run),
                             *extra], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def blender_children(pid_file: Path) -> list[int]:
    """Blender processes rendering into this run (found by their output path)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"blender" in cmd and str(pid_file).encode() in cmd:
                out.append(int(entry.name))
    return out


def test_render_pilot_refuses_a_frame_with_blenders_message_and_resumes_after_sigkill(
        shots: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(spec_dict(shots, "r-blender")))
    run = tmp_path / "run"
    first = runner(spec, run)
    ledger_has_one = lambda: any(e["type"] == "item.done"  # noqa: E731
                                 for e in (events(run) if (run / "events.jsonl").exists()
                                           else []))
    wait_until(lambda: ledger_has_one() or first.poll() is not None, "the first frame", 120)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert first.stderr is not None
    first.stderr.close()
    # Nothing of the run keeps rendering once its runner is gone.
    wait_until(lambda: not [p for p in blender_children(run) if alive(p)],
               "the killed runner's Blender to end", 30)
    done_before = {e["id"] for e in events(run) if e["type"] == "item.done"}
    assert done_before == {"shot01.blend#0001"}

    second = runner(spec, run, "--resume")
    _out, err = second.communicate(timeout=180)
    assert second.returncode == 0, err.decode()[-2000:]
    evs = events(run)
    assert stage(evs, "environment")["facts"]["version"]
    for skipped in ("torch", "interconnect", "extensions"):
        assert stage(evs, skipped)["type"] == "stage.skipped"
        assert stage(evs, skipped)["reason"].startswith("preparation blender: ")
    dev = stage(evs, "device")["facts"]
    assert dev["cycles_device"] == "CPU" and dev["probe_seconds"] > 0
    compute = stage(evs, "compute")["facts"]
    assert compute["seconds"] > 0 and compute["render_seconds"] is not None
    assert compute["cpu_ratio"] is None  # the chosen device is the CPU itself
    assert stage(evs, "memory")["facts"]["peak_device_mib"] > 0
    pilot = stage(evs, "pilot")["facts"]
    assert pilot["already_done"] == len(done_before)
    assert pilot["rendered"] == 1  # only what was missing
    done = [e for e in evs if e["type"] == "item.done" and not e.get("replayed")]
    assert sorted(e["id"] for e in done) == ["shot01.blend#0001", "shot01.blend#0002"]
    refused = [e for e in done if e["status"] == "refused"]
    assert [(e["id"], e["reason"]) for e in refused] == [
        ("shot01.blend#0002", "RuntimeError: cache for frame 2 is missing: "
                              "sim/cache_0002.bphys")]
    balance = json.loads((run / "balance.json").read_text())
    assert (balance["accepted"], balance["refused"], balance["total"], balance["ok"]) == \
        (1, 1, 2, True)
    for row in balance["rows"]:
        if row["status"] == "accepted":
            assert row["category"] == "rendered"
            assert (run / row["output"]).stat().st_size > 0


def test_volume_worker_refuses_a_missing_texture_with_blenders_report(
        shots: Path, tmp_path: Path) -> None:
    """The volume's workers render through the handler: same command line, same judgement;
    a texture that is not there stops the frame with Blender's own missing-file report."""
    from runner.blender.handler import render
    from runner.inputs import Item
    from runner.workloads import load_handler, make_context

    spec = RunSpec.from_dict(spec_dict(shots, "v-stage"))
    assert load_handler(spec) is render
    wctx = make_context(spec, str(tmp_path / "outputs"))
    wctx.device = "cpu"
    blend = shots / "missing.blend"
    [result] = render([Item("missing.blend#0001", str(blend), blend.stat().st_size)], wctx)
    assert result["status"] == "refused" and result["elapsed_s"] > 0
    assert result["reason"] == (f"Warning: Path '{shots / 'textures' / 'brick_diffuse.png'}' "
                                "not found")
    assert not (tmp_path / "outputs" / "frames" / "missing.blend" / "0001.png").exists()


def ctx_for(shots: Path, tmp_path: Path, **changes: Any) -> StageContext:
    raw = spec_dict(shots, "r-stage")
    blender = {**raw["blender"], **changes.pop("blender", {})}
    spec = RunSpec.from_dict({**raw, **changes, "blender": blender})
    return StageContext(spec=spec, run_dir=str(tmp_path))


def test_cuda_asked_on_a_node_without_it_fails_naming_what_cycles_sees(
        shots: Path, tmp_path: Path) -> None:
    with pytest.raises(StageFailure) as info:
        device(ctx_for(shots, tmp_path, backend="cuda"))
    assert "Cycles sees no OptiX or CUDA device (backend cuda); it sees: " in info.value.message
    assert "CPU: " in info.value.message
    assert info.value.facts["probe_seconds"] > 0


def test_environment_version_and_addons_are_checked(shots: Path, tmp_path: Path) -> None:
    with pytest.raises(StageFailure, match="add-ons not usable: no_such_addon "
                                           r"\(not installed\)") as info:
        environment(ctx_for(shots, tmp_path, blender={"addons": ["no_such_addon"],
                                                      "version": ">=3"}))
    facts = info.value.facts
    assert facts["matches"] is True and facts["version"].startswith(("3.", "4.", "5."))
    facts = {"version": facts["version"], "path": facts["path"]}
    with pytest.raises(StageFailure, match=r"does not satisfy blender.version '<2.80'"):
        _check_version(facts, "<2.80")
    with pytest.raises(StageFailure, match="'no-blender-here' not found on PATH"):
        environment(ctx_for(shots, tmp_path, blender={"executable": "no-blender-here"}))


def test_the_projects_requirements_are_checked_before_blender_starts(
        shots: Path, tmp_path: Path) -> None:
    (shots / "requirements.txt").write_text("no-such-package-for-preflight==1.0\n")
    with pytest.raises(StageFailure, match="missing: no-such-package-for-preflight"):
        environment(ctx_for(shots, tmp_path, project={"dir": str(shots),
                                                      "requirements": "requirements.txt"}))


def test_licences_are_checked_without_their_values(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RENDER_LICENSE_KEY", "s3cr3t-value")
    secret = tmp_path / "license.lic"
    secret.write_text("another-s3cr3t")
    server = socket.create_server(("127.0.0.1", 0))
    try:
        port = server.getsockname()[1]
        closed = socket.create_server(("127.0.0.1", 0))
        closed_port = closed.getsockname()[1]
        closed.close()
        facts = [checks.check_license(e) for e in (
            {"env": "RENDER_LICENSE_KEY"}, {"env": "NOT_SET_ANYWHERE"},
            {"file": str(secret)}, {"file": str(tmp_path / "absent.lic")},
            {"name": "rlm", "tcp": f"127.0.0.1:{port}"}, {"tcp": f"127.0.0.1:{closed_port}"})]
    finally:
        server.close()
    assert [f["ok"] for f in facts] == [True, False, True, False, True, False]
    assert "s3cr3t" not in json.dumps(facts)
    assert facts[4]["name"] == "rlm"
    message = checks.describe_licenses(facts)
    assert "NOT_SET_ANYWHERE: environment variable NOT_SET_ANYWHERE is not set" in message
    assert "absent.lic is not readable" in message
    assert f"127.0.0.1:{closed_port} does not answer" in message
    assert os.environ["RENDER_LICENSE_KEY"] not in message
