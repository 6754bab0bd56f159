"""Hostile and awkward inputs, made from the real sample photos (tests and bench/hostile.py).

* :func:`declared_huge_png`: a tiny file that declares a near-limit pixel count;
* :func:`group_photo`: a grid of sample faces (a valid many-face photo);
* :func:`truncated_jpeg_with_eoi`: half a real JPEG with an end marker appended;
* :func:`truncated_multipart` / :func:`nested_json`: bodies that must be 400s;
* :func:`raw_request`: a request sent over a plain socket, optionally trickled.
"""

from __future__ import annotations

import io
import socket
import struct
import time
import zlib

import numpy as np
from PIL import Image


def declared_huge_png(pixels: int = 39_000_000, *, seed: int = 0) -> bytes:
    """A valid RGB PNG of about ``pixels`` pixels that compresses to ~100 KB
    (flat colour with a little noise in the first rows, so it is not trivial)."""
    side = int(pixels ** 0.5)
    width, height = side, pixels // side
    rng = np.random.default_rng(seed)
    row_plain = b"\x00" + bytes((120, 130, 140)) * width
    noisy = [b"\x00" + rng.integers(0, 256, width * 3, dtype=np.uint8).tobytes()
             for _ in range(4)]
    comp = zlib.compressobj(9)
    parts = [comp.compress(r) for r in noisy]
    parts += [comp.compress(row_plain) for _ in range(height - len(noisy))]
    parts.append(comp.flush())
    idat = b"".join(parts)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


def group_photo(faces: list[np.ndarray], columns: int, rows: int, cell: int = 260) -> bytes:
    """A JPEG grid of ``columns × rows`` portraits (cycling through ``faces``)."""
    canvas = Image.new("RGB", (columns * cell, rows * cell), (235, 235, 235))
    for i in range(columns * rows):
        im = Image.fromarray(faces[i % len(faces)])
        im.thumbnail((cell - 10, cell - 10))
        canvas.paste(im, ((i % columns) * cell + 5, (i // columns) * cell + 5))
    buf = io.BytesIO()
    canvas.save(buf, "JPEG", quality=92)
    return buf.getvalue()


def truncated_jpeg_with_eoi(jpeg: bytes) -> bytes:
    """The first half of a JPEG with an end-of-image marker appended."""
    return jpeg[: len(jpeg) // 2] + b"\xff\xd9"


def multipart(fields: dict[str, tuple[str, bytes]], boundary: str = "hostileboundary") -> bytes:
    """A multipart/form-data body: name → (filename or "" for a text field, bytes)."""
    out = b""
    for name, (filename, data) in fields.items():
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def truncated_multipart(fields: dict[str, tuple[str, bytes]],
                        boundary: str = "hostileboundary") -> bytes:
    """A multipart body cut inside its last part (no closing boundary)."""
    body = multipart(fields, boundary)
    return body[: len(body) - 200]


def nested_json(depth: int = 100_000) -> bytes:
    """``{"image": [[[[...]]]]}`` nested ``depth`` levels."""
    return b'{"image": ' + b"[" * depth + b"]" * depth + b"}"


def raw_request(port: int, head: bytes, body: bytes = b"", *, trickle: int = 0,
                pause_s: float = 0.0, read_timeout_s: float = 60.0) -> bytes:
    """Send ``head`` + ``body`` over a new loopback socket and return what comes back
    (until the server closes or ``read_timeout_s`` passes without data).

    ``trickle`` > 0 sends the first ``trickle`` bytes one at a time with
    ``pause_s`` between them, then stops sending (a slow client).
    """
    data = head + body
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout_s) as s:
        if trickle:
            for i in range(min(trickle, len(data))):
                s.sendall(data[i:i + 1])
                time.sleep(pause_s)
        else:
            s.sendall(data)
        chunks = []
        try:
            while True:
                got = s.recv(65536)
                if not got:
                    break
                chunks.append(got)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def status_of(response: bytes) -> int:
    """The status code of a raw HTTP/1.1 response (0 when nothing came back)."""
    if not response.startswith(b"HTTP/1."):
        return 0
    return int(response.split(b" ", 2)[1])
