"""Check a rendered PNG with the standard library (zlib): it decodes, has the size asked
for, and is not one flat colour.

The whole file is decoded (every chunk's CRC, the zlib stream, every scanline's filter),
so a truncated or corrupt frame is caught, not only a bad header. Blender writes
non-interlaced PNGs; an interlaced one is reported as such rather than half-checked.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import List, Optional, Tuple

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel
MAX_PIXELS = 1 << 28


class ImageError(ValueError):
    """The image is missing, does not decode, or fails a check; the message says which."""


@dataclass(frozen=True)
class ImageInfo:
    width: int
    height: int
    bit_depth: int
    color_type: int
    uniform: bool
    bytes: int


def read_png(path: str) -> ImageInfo:
    """Decode ``path`` fully; ImageError naming what is wrong."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError as exc:
        raise ImageError(f"no image at {path}") from exc
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not data.startswith(SIGNATURE):
        raise ImageError(f"{path} is not a PNG (bad signature)")
    header, idat = _chunks(data, path)
    width, height, depth, ctype, interlace = header
    if interlace:
        raise ImageError(f"{path} is interlaced (Adam7), which this check does not decode")
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as exc:
        raise ImageError(f"{path}: image data does not decompress: {exc}") from exc
    bpp = max(1, _CHANNELS[ctype] * depth // 8)
    stride = (width * _CHANNELS[ctype] * depth + 7) // 8
    if len(raw) != height * (stride + 1):
        raise ImageError(f"{path}: {len(raw)} bytes of pixel data, expected "
                         f"{height * (stride + 1)} for {width}x{height} (truncated image?)")
    uniform = _unfilter_uniform(raw, height, stride, bpp, path)
    return ImageInfo(width, height, depth, ctype, uniform, len(data))


def _chunks(data: bytes, path: str) -> Tuple[Tuple[int, int, int, int, int], List[bytes]]:
    pos, header, idat, ended = len(SIGNATURE), None, [], False
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc = data[pos + 8 + length:pos + 12 + length]
        if len(body) != length or len(crc) != 4:
            raise ImageError(f"{path}: chunk {ctype!r} is cut short (truncated file)")
        if struct.unpack(">I", crc)[0] != zlib.crc32(ctype + body) & 0xFFFFFFFF:
            raise ImageError(f"{path}: chunk {ctype.decode('latin-1')} fails its CRC")
        if ctype == b"IHDR":
            header = _header(body, path)
        elif ctype == b"IDAT":
            idat.append(body)
        elif ctype == b"IEND":
            ended = True
            break
        pos += 12 + length
    if header is None:
        raise ImageError(f"{path}: no IHDR chunk")
    if not idat:
        raise ImageError(f"{path}: no image data (IDAT)")
    if not ended:
        raise ImageError(f"{path}: no IEND chunk (truncated file)")
    return header, idat


def _header(body: bytes, path: str) -> Tuple[int, int, int, int, int]:
    if len(body) != 13:
        raise ImageError(f"{path}: IHDR has {len(body)} bytes, not 13")
    width, height, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", body)
    if ctype not in _CHANNELS or depth not in (1, 2, 4, 8, 16) or comp or filt:
        raise ImageError(f"{path}: unsupported PNG header (colour type {ctype}, depth {depth})")
    if not width or not height or width * height > MAX_PIXELS:
        raise ImageError(f"{path}: implausible size {width}x{height}")
    return width, height, depth, ctype, interlace


def _unfilter_uniform(raw: bytes, height: int, stride: int, bpp: int, path: str) -> bool:
    """Undo the scanline filters; True when every pixel equals the first one."""
    prev = bytearray(stride)
    first: Optional[bytes] = None
    uniform = True
    for y in range(height):
        start = y * (stride + 1)
        ftype = raw[start]
        line = bytearray(raw[start + 1:start + 1 + stride])
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            _paeth(line, prev, bpp)
        elif ftype != 0:
            raise ImageError(f"{path}: scanline {y} has unknown filter type {ftype}")
        if uniform:
            if first is None:
                first = bytes(line[:bpp])
            uniform = line == first * (stride // bpp)
        prev = line
    return uniform


def _paeth(line: bytearray, prev: bytearray, bpp: int) -> None:
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        line[i] = (line[i] + pred) & 0xFF


def check_image(path: str, want: Optional[Tuple[int, int]], allow_uniform: bool) -> ImageInfo:
    """``read_png`` plus the checks a rendered frame must pass; ImageError naming the one
    that fails."""
    info = read_png(path)
    if want is not None and (info.width, info.height) != tuple(want):
        raise ImageError(f"image is {info.width}x{info.height}, the render asked for "
                         f"{want[0]}x{want[1]}")
    if info.uniform and not allow_uniform:
        raise ImageError("image is one flat colour (set blender.allow_uniform_frames when "
                         "a blank frame is expected)")
    return info
