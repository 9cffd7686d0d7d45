"""The Blender preparation's pure parts: frame ids, Cycles probe outputs of real node kinds,
the PNG check, and Blender's log read for its first error and peak memory."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from runner.blender.cycles import NoDevice, ProbeError, choose_device, parse_probe
from runner.blender.png import ImageError, check_image, read_png
from runner.blender.process import (
    first_error,
    host_peak_mib,
    peak_memory_mib,
    render_seconds,
    saved_paths,
)
from runner.frames import FramesError, frame_id, parse_frames, split_frame_id
from runner.inputs import InputsError, list_frames

OUTPUTS = Path(__file__).parent / "blender_outputs"


# ------------------------------------------------------------------ frames

@pytest.mark.parametrize(("value", "frames"), [
    ("1-4", [1, 2, 3, 4]), ("1-9x4", [1, 5, 9]), ("3, 1,7", [1, 3, 7]), (5, [5]),
    ([1, "4-5"], [1, 4, 5]), ("0", [0]), ("-2--1", [-2, -1]),
])
def test_frames_read_ranges_steps_and_lists(value: object, frames: list[int]) -> None:
    assert parse_frames(value) == frames


@pytest.mark.parametrize(("value", "words"), [
    ("1-4,3", "frame 3 is listed more than once"), ("5-1", "ends before it starts"),
    ("1-x", "is not a frame"), ("", "is not a frame"), ([], "no frame selected"),
    (True, "expected a frame range"), ("1-5x0", "step must be at least 1"),
    ("1-2000000", "outside Blender's range"), ([1.5], "not a frame number"),
])
def test_frames_errors_name_the_part(value: object, words: str) -> None:
    with pytest.raises(FramesError, match=words):
        parse_frames(value)


def test_frame_ids_round_trip_and_sort_in_frame_order() -> None:
    assert frame_id("shot01.blend", 7) == "shot01.blend#0007"
    assert split_frame_id("shot01.blend#0007") == ("shot01.blend", 7)
    assert split_frame_id("a#b.blend#0012") == ("a#b.blend", 12)
    ids = [frame_id("s.blend", n) for n in (1, 2, 10, 100)]
    assert ids == sorted(ids)
    with pytest.raises(ValueError, match="not a frame id"):
        split_frame_id("shot01")


def test_list_frames_one_item_per_frame_of_each_file(tmp_path: Path) -> None:
    for name in ("shot02.blend", "shot01.blend", "notes.txt"):
        (tmp_path / name).write_bytes(b"BLENDER")
    items = list_frames(str(tmp_path), "*.blend", "1-2")
    assert [it.id for it in items] == ["shot01.blend#0001", "shot01.blend#0002",
                                       "shot02.blend#0001", "shot02.blend#0002"]
    assert items[0].path == str(tmp_path / "shot01.blend")
    with pytest.raises(InputsError, match="inputs.frames: frame 2 is listed more than once"):
        list_frames(str(tmp_path), "*.blend", [1, 2, 2])


# ------------------------------------------------------------------ Cycles probe

def probe(name: str) -> str:
    return (OUTPUTS / name).read_text(encoding="utf-8")


def test_cuda_node_renders_on_optix_with_every_card() -> None:
    view = parse_probe(probe("cuda_h100x2.txt"))
    assert view.blender == "4.1.1"
    assert view.offered == ["CUDA", "OPTIX", "HIP", "ONEAPI"]
    kind, devices = choose_device(view, "cuda")
    assert kind == "OPTIX"
    assert [d["name"] for d in devices] == ["NVIDIA H100 80GB HBM3"] * 2
    assert choose_device(view, "cuda", "CUDA")[0] == "CUDA"
    assert view.cpu == ["AMD EPYC 9654 96-Core Processor"]


def test_cuda_without_optix_falls_back_to_cuda_and_keeps_the_optix_error() -> None:
    view = parse_probe(probe("cuda_only_l4.txt"))
    kind, devices = choose_device(view, "cuda")
    assert (kind, [d["name"] for d in devices]) == ("CUDA", ["NVIDIA L4"])
    assert "OptiX initialization failed" in view.errors[0]
    with pytest.raises(NoDevice, match="no OptiX device"):
        choose_device(view, "cuda", "optix")


def test_hip_node_asked_for_cuda_fails_naming_what_cycles_sees() -> None:
    view = parse_probe(probe("hip_mi300x.txt"))
    assert choose_device(view, "rocm")[0] == "HIP"
    with pytest.raises(NoDevice) as info:
        choose_device(view, "cuda")
    message = str(info.value)
    assert "Cycles sees no OptiX or CUDA device (backend cuda)" in message
    assert "HIP: AMD Instinct MI300X" in message
    assert "CUDA: no device" in message


def test_cpu_only_node_has_no_gpu_device_and_renders_on_the_cpu() -> None:
    view = parse_probe(probe("none.txt"))
    assert all(not devices for devices in view.backends.values())
    assert choose_device(view, "cpu") == ("CPU", [{"name": view.cpu[0], "id": "CPU"}])
    with pytest.raises(NoDevice, match="it sees: CUDA: no device; HIP: no device; CPU: "):
        choose_device(view, "cuda")


def test_a_build_without_gpu_backends_says_so() -> None:
    view = parse_probe('PREFLIGHT_CYCLES {"blender": "3.4.1", "offered": [], "backends": {},'
                       ' "cpu": ["Xeon"], "errors": []}\n')
    with pytest.raises(NoDevice, match="no GPU backend in this Blender build; CPU: Xeon"):
        choose_device(view, "rocm")


@pytest.mark.parametrize(("output", "words"), [
    ("Blender 3.4.1\nBlender quit\n", "printed no Cycles probe line"),
    ("PREFLIGHT_CYCLES {not json\n", "not JSON"),
    ("PREFLIGHT_CYCLES [1, 2]\n", "not a JSON object"),
])
def test_unreadable_probe_output_is_named(output: str, words: str) -> None:
    with pytest.raises(ProbeError, match=words):
        parse_probe(output)


# ------------------------------------------------------------------ PNG

def png(width: int, height: int, rows: list[bytes], filters: list[int] | None = None,
        ctype: int = 2) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    filters = filters or [0] * height
    raw = b"".join(bytes([f]) + r for f, r in zip(filters, rows))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8,
                                                               ctype, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_png_decodes_every_filter_and_tells_a_flat_image(tmp_path: Path) -> None:
    # Filter 1 (Sub) with zero deltas and filter 2 (Up) with zero rows repeat the first
    # pixel: a flat image written with filters is still flat.
    flat = png(2, 3, [b"\x10\x20\x30" * 2, b"\x10\x20\x30\x00\x00\x00", b"\x00" * 6],
               filters=[0, 1, 2])
    (tmp_path / "flat.png").write_bytes(flat)
    assert read_png(str(tmp_path / "flat.png")).uniform
    with pytest.raises(ImageError, match="one flat colour"):
        check_image(str(tmp_path / "flat.png"), (2, 3), allow_uniform=False)
    assert check_image(str(tmp_path / "flat.png"), (2, 3), allow_uniform=True).width == 2
    rows = [b"\x10\x20\x30\x01\x01\x01", b"\x00" * 6, b"\x05" * 6, b"\x07" * 6]
    (tmp_path / "var.png").write_bytes(png(2, 4, rows, filters=[1, 2, 3, 4]))
    info = read_png(str(tmp_path / "var.png"))
    assert (info.width, info.height, info.uniform) == (2, 4, False)


def test_png_wrong_size_truncated_corrupt_and_missing_are_named(tmp_path: Path) -> None:
    good = png(2, 2, [b"\x01\x02\x03\x04\x05\x06"] * 2)
    (tmp_path / "a.png").write_bytes(good)
    with pytest.raises(ImageError, match="image is 2x2, the render asked for 64x64"):
        check_image(str(tmp_path / "a.png"), (64, 64), allow_uniform=True)
    (tmp_path / "cut.png").write_bytes(good[:-20])
    with pytest.raises(ImageError, match="truncated"):
        read_png(str(tmp_path / "cut.png"))
    bad = bytearray(good)
    bad[40] ^= 0xFF
    (tmp_path / "crc.png").write_bytes(bytes(bad))
    with pytest.raises(ImageError, match="fails its CRC"):
        read_png(str(tmp_path / "crc.png"))
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(ImageError, match="not a PNG"):
        read_png(str(tmp_path / "text.png"))
    with pytest.raises(ImageError, match="no image at"):
        read_png(str(tmp_path / "absent.png"))
    short = png(2, 2, [b"\x01\x02\x03\x04\x05\x06"])  # one row of data for two
    (tmp_path / "short.png").write_bytes(short)
    with pytest.raises(ImageError, match="expected 14 for 2x2"):
        read_png(str(tmp_path / "short.png"))


# ------------------------------------------------------------------ Blender's log

RENDER_LOG = """Blender 3.4.1
Read blend: /p/shot01.blend
Fra:3 Mem:9.40M (Peak 11.12M) | Time:00:00.06 | Mem:0.25M, Peak:0.25M | Scene | Updating
Fra:3 Mem:1.20G (Peak 1.50G) | Time:00:01.06 | Mem:2.50G, Peak:3.25G | Scene | Sample 4/4
Fra:3 Mem:9.90M (Peak 11.12M) | Time:00:01.07 | Mem:0.76M, Peak:0.76M | Scene | Finished
Saved: '/runs/r1/outputs/frames/shot01.blend/0003.png'
 Time: 00:01.26 (Saving: 00:00.19)
"""


def test_log_peak_memory_saved_image_render_time_and_no_error() -> None:
    assert render_seconds(RENDER_LOG) == 1.07
    assert render_seconds(" Time: 1:02:03.50 (Saving: 00:01.50)\n") == 3722.0
    assert render_seconds("Blender quit\n") is None
    assert peak_memory_mib(RENDER_LOG) == 3328.0
    assert host_peak_mib(RENDER_LOG) == 1536.0
    assert saved_paths(RENDER_LOG) == ["/runs/r1/outputs/frames/shot01.blend/0003.png"]
    assert first_error(RENDER_LOG) is None
    assert peak_memory_mib("Blender 3.4.1\n") is None


@pytest.mark.parametrize(("log", "error"), [
    ("Read blend: /p/a.blend\nWarning: Path '/p/tex/brick.png' not found\n",
     "Warning: Path '/p/tex/brick.png' not found"),
    ("Traceback (most recent call last):\n  File \"/p/a.blend/guard.py\", line 5, in g\n"
     "RuntimeError: cache for frame 3 is missing\nSaved: 'x.png'\n",
     "RuntimeError: cache for frame 3 is missing"),
    ("Fra:1 Mem:9M (Peak 9M) | Time:00:00.06 | Mem:0.25M, Peak:0.25M | Scene | Loading\n"
     "Error: Out of memory in cuMemAlloc(&device_pointer, size) "
     "(intern/cycles/device/cuda/device_impl.cpp:771)\n",
     "Error: Out of memory in cuMemAlloc(&device_pointer, size) "
     "(intern/cycles/device/cuda/device_impl.cpp:771)"),
    ("Fra:1 Mem:9M (Peak 9M) | Time:00:00.06 | Mem:0.25M, Peak:0.25M | Scene | "
     "System is out of GPU memory\n", "Fra:1 Mem:9M (Peak 9M) | Time:00:00.06 | "
     "Mem:0.25M, Peak:0.25M | Scene | System is out of GPU memory"),
    ("Error: Cannot read file \"/p/missing.blend\": No such file or directory\n",
     "Error: Cannot read file \"/p/missing.blend\": No such file or directory"),
])
def test_first_error_is_blenders_own_line(log: str, error: str) -> None:
    assert first_error(log) == error


def test_unfreed_memory_report_at_quit_is_not_an_error() -> None:
    log = RENDER_LOG + "Error: Not freed memory blocks: 2, total unfreed memory 0.0 MB\n"
    assert first_error(log) is None


# ------------------------------------------------------------------ supervision

def fake_blender(tmp_path: Path, body: str) -> str:
    """An executable standing in for Blender: the supervision does not care what runs."""
    exe = tmp_path / "fake-blender"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return str(exe)


def render_with(exe: str, tmp_path: Path, timeout: float = 30.0) -> Any:
    from runner.blender.render import RenderSetup, render_frame

    return render_frame(RenderSetup(executable=exe, timeout_s=timeout),
                        str(tmp_path / "shot.blend"), 7, str(tmp_path / "out"),
                        str(tmp_path / "logs" / "shot.log"))


def test_a_frame_past_its_timeout_is_killed_and_refused(tmp_path: Path) -> None:
    exe = fake_blender(tmp_path, "echo rendering; exec sleep 30")
    result = render_with(exe, tmp_path, timeout=0.5)
    assert result.status == "refused"
    assert result.reason.startswith("timed out after 0.")
    assert result.reason.endswith(" s (blender.frame_timeout_s)")
    assert result.seconds < 10
    assert "rendering" in Path(result.log_path).read_text()


def test_exit_code_error_line_and_missing_image_are_refusals(tmp_path: Path) -> None:
    crashed = render_with(fake_blender(tmp_path, "exit 139"), tmp_path)
    assert crashed.reason == "blender exited with code 139"
    errored = render_with(fake_blender(
        tmp_path, "echo 'Fra:7 Mem:9M (Peak 9M) | Mem:1.00G, Peak:7.50G | Scene | Sample 1'; "
                  "echo 'Error: Out of memory in cuMemAlloc(&device_pointer, size)'"), tmp_path)
    assert errored.reason == "Error: Out of memory in cuMemAlloc(&device_pointer, size)"
    assert errored.peak_device_mib == 7680.0
    nothing = render_with(fake_blender(tmp_path, "exit 0"), tmp_path)
    assert nothing.reason == f"no image at {tmp_path / 'out' / '0007.png'}"


def test_an_image_of_the_asked_size_is_accepted(tmp_path: Path) -> None:
    image = tmp_path / "made.png"
    image.write_bytes(png(2, 2, [b"\x01\x02\x03\x04\x05\x06", b"\x09" * 6]))
    exe = fake_blender(tmp_path, "echo 'PREFLIGHT_RENDER {\"width\": 2, \"height\": 2}'; "
                                 f"echo \"Saved: '{image}'\"")
    result = render_with(exe, tmp_path)
    assert (result.status, result.image, result.reason) == ("accepted", str(image), None)
    assert result.to_result("shot.blend#0007") == {
        "id": "shot.blend#0007", "status": "accepted", "category": "rendered",
        "output": str(image)}
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    exe = fake_blender(wrong, "echo 'PREFLIGHT_RENDER {\"width\": 64, \"height\": 64}'; "
                              f"echo \"Saved: '{image}'\"")
    assert render_with(exe, tmp_path).reason == "image is 2x2, the render asked for 64x64"


@pytest.mark.parametrize(("lots", "nodes", "ok"), [(2, 1, True), (4, 2, True), (4, 1, False)])
def test_cycles_must_show_the_node_s_share_of_the_rent(tmp_path: Path, lots: int, nodes: int,
                                                       ok: bool) -> None:
    """The same rule as the device stage of any pilot (runner.spec.node_share): 4 cards
    over 2 nodes is 2 on this node, which Cycles shows; 4 on one node is 2 missing."""
    from runner.blender.stages import device
    from runner.spec import RunSpec, node_share
    from runner.stage import StageContext, StageFailure

    exe = fake_blender(tmp_path, f"cat {OUTPUTS / 'cuda_h100x2.txt'}")
    spec = RunSpec.from_dict({
        "run_id": "r", "name": "b", "backend": "cuda", "preparation": "blender",
        "inputs": {"dir": str(tmp_path)},
        "hardware": {"gpu": "H100", "lots": lots, "cards_per_lot": 1, "nodes": nodes,
                     "node_cards": node_share(lots, 1, nodes)}})
    ctx = StageContext(spec=spec, run_dir=str(tmp_path), facts={"environment": {"path": exe}})
    if ok:
        assert device(ctx)["count"] == 2
        return
    with pytest.raises(StageFailure, match="this node has 4 card\\(s\\) rented") as caught:
        device(ctx)
    assert caught.value.error_type == "MissingCards"
