"""decode_image / probe_image: formats, limits, truncation, bombs, EXIF, modes, arrays."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from facefuse.config import Settings
from facefuse.errors import (
    CorruptImageError,
    EmptyImageError,
    ImageTooLargeError,
    ImageTooSmallError,
    InvalidArgumentError,
    InvalidImageError,
    UnsupportedFormatError,
)
from facefuse.imaging.decode import DecodeLimits, ImageInfo, decode_image, probe_image

# --- helpers ---------------------------------------------------------------------------------


def _png_chunk(ctype: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(ctype + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + ctype + data + struct.pack(">I", crc)


def _png_with_header(
    width: int, height: int, idat: bytes, *, depth: int = 8, ctype: int = 2
) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, depth, ctype, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def _save(im: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _pillow_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


@pytest.fixture(scope="module")
def photo(sample_images: dict[str, np.ndarray]) -> np.ndarray:
    """A 96×80 crop of a real photo, RGB uint8."""
    return np.ascontiguousarray(sample_images["astronaut"][40:120, 180:276])


@pytest.fixture(scope="module")
def obama_bytes(sample_paths: dict[str, Path]) -> bytes:
    return sample_paths["obama"].read_bytes()


@pytest.fixture(scope="module")
def small_files(photo: np.ndarray) -> dict[str, bytes]:
    im = Image.fromarray(photo)
    return {
        "jpeg": _save(im, "JPEG", quality=90),
        "png": _save(im, "PNG"),
        "webp": _save(im, "WEBP", quality=80),
        "webp_lossless": _save(im, "WEBP", lossless=True),
    }


# --- real photos -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["obama", "obama2", "obama3", "biden", "astronaut"])
def test_sample_photos_decode_like_pillow(sample_paths: dict[str, Path], name: str) -> None:
    data = sample_paths[name].read_bytes()
    rgb = decode_image(data)
    info = probe_image(data)
    assert rgb.dtype == np.uint8
    assert rgb.ndim == 3
    assert rgb.shape[2] == 3
    assert rgb.flags.c_contiguous
    assert rgb.flags.writeable
    assert rgb.shape[:2] == (info.height, info.width)
    with Image.open(io.BytesIO(data)) as im:
        expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    np.testing.assert_array_equal(rgb, expected)


def test_every_input_kind_gives_the_same_pixels(sample_paths: dict[str, Path]) -> None:
    path = sample_paths["obama"]
    data = path.read_bytes()
    ref = decode_image(data)
    for value in (bytearray(data), memoryview(data), str(path), path):
        np.testing.assert_array_equal(decode_image(value), ref)


def test_probe_reads_the_header_only(obama_bytes: bytes) -> None:
    assert len(obama_bytes) > 250_000
    info = probe_image(obama_bytes[:32_768])  # pixel data cut away: the header suffices
    assert info == ImageInfo("jpeg", 910, 1137)
    assert info.pixels == 910 * 1137


def test_probe_png_and_webp(small_files: dict[str, bytes]) -> None:
    assert probe_image(small_files["png"][:40]) == ImageInfo("png", 96, 80)
    assert probe_image(small_files["webp"]) == ImageInfo("webp", 96, 80)
    assert probe_image(small_files["webp_lossless"]) == ImageInfo("webp", 96, 80)


def test_all_small_formats_decode(small_files: dict[str, bytes], photo: np.ndarray) -> None:
    np.testing.assert_array_equal(decode_image(small_files["png"]), photo)
    np.testing.assert_array_equal(decode_image(small_files["webp_lossless"]), photo)
    for key in ("jpeg", "webp"):
        out = decode_image(small_files[key])
        assert out.shape == photo.shape
        assert np.abs(out.astype(int) - photo.astype(int)).mean() < 6


# --- files ----------------------------------------------------------------------------------------


def test_missing_file_is_a_clear_invalid_image_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jpg"
    with pytest.raises(InvalidImageError, match="not found") as info:
        decode_image(missing)
    assert str(missing) in info.value.message
    assert info.value.code == "invalid_image"


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidImageError, match="not a regular file"):
        decode_image(str(tmp_path))


def test_file_size_is_checked_before_reading(tmp_path: Path) -> None:
    # A sparse 1 GiB file: refused from its size alone.
    big = tmp_path / "huge.jpg"
    with big.open("wb") as fh:
        fh.write(b"\xff\xd8\xff")
        fh.truncate(1024**3)
    with pytest.raises(ImageTooLargeError, match="bytes"):
        decode_image(big)


def test_empty_file_and_empty_bytes(tmp_path: Path) -> None:
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(EmptyImageError):
        decode_image(empty)
    with pytest.raises(EmptyImageError):
        decode_image(b"")
    with pytest.raises(EmptyImageError):
        probe_image(b"")


# --- formats --------------------------------------------------------------------------------------


def test_text_renamed_jpg_is_unsupported(tmp_path: Path) -> None:
    fake = tmp_path / "photo.jpg"
    fake.write_text("this is not a picture\n")
    with pytest.raises(UnsupportedFormatError, match="text") as info:
        decode_image(fake)
    assert info.value.http_status == 415


@pytest.mark.parametrize(("fmt", "label"), [("GIF", "GIF"), ("BMP", "BMP"), ("TIFF", "TIFF")])
def test_other_image_formats_are_unsupported(photo: np.ndarray, fmt: str, label: str) -> None:
    data = _save(Image.fromarray(photo), fmt)
    assert _pillow_rgb(data).shape == photo.shape  # a perfectly good image, just not allowed
    with pytest.raises(UnsupportedFormatError, match=label):
        decode_image(data)


def test_webp_magic_must_say_webp() -> None:
    with pytest.raises(UnsupportedFormatError, match="RIFF"):
        decode_image(b"RIFF\x10\x00\x00\x00WAVEfmt " + bytes(40))


# --- limits ---------------------------------------------------------------------------------------


def test_over_max_bytes(small_files: dict[str, bytes]) -> None:
    data = small_files["png"]
    with pytest.raises(ImageTooLargeError) as info:
        decode_image(data, DecodeLimits(max_bytes=len(data) - 1))
    assert info.value.http_status == 413
    assert decode_image(data, DecodeLimits(max_bytes=len(data))).shape == (80, 96, 3)


def test_over_max_pixels(small_files: dict[str, bytes]) -> None:
    with pytest.raises(ImageTooLargeError, match="pixels"):
        decode_image(small_files["jpeg"], DecodeLimits(max_pixels=96 * 80 - 1))
    assert decode_image(small_files["jpeg"], DecodeLimits(max_pixels=96 * 80)).shape == (80, 96, 3)


def _jpeg_with_size(jpeg: bytes, width: int, height: int) -> bytes:
    """Patch the SOF0 frame header of a baseline JPEG to claim another size."""
    pos = jpeg.index(b"\xff\xc0")
    return jpeg[: pos + 5] + struct.pack(">HH", height, width) + jpeg[pos + 9 :]


def _vp8x_header(width: int, height: int) -> bytes:
    payload = (
        b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    )
    body = b"WEBP" + b"VP8X" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.fixture
def pillow_must_not_open(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Pillow was asked to open an image the header check should refuse")

    monkeypatch.setattr(Image, "open", refuse)  # the module decode.py uses


@pytest.mark.usefixtures("pillow_must_not_open")
def test_header_bombs_are_refused_before_pillow_sees_them(small_files: dict[str, bytes]) -> None:
    png = _png_with_header(50_000, 50_000, zlib.compress(b"\x00" * 1000))
    jpeg = _jpeg_with_size(small_files["jpeg"], 50_000, 50_000)
    webp = _vp8x_header(16_384, 16_384)
    assert probe_image(png) == ImageInfo("png", 50_000, 50_000)
    assert probe_image(jpeg) == ImageInfo("jpeg", 50_000, 50_000)
    assert probe_image(webp) == ImageInfo("webp", 16_384, 16_384)
    for data in (png, jpeg, webp):
        with pytest.raises(ImageTooLargeError, match="pixels"):
            decode_image(data)


def test_pillow_decompression_bomb_error_is_mapped() -> None:
    # Our limit raised above Pillow's own (2 × MAX_IMAGE_PIXELS): Pillow refuses at open.
    before = Image.MAX_IMAGE_PIXELS
    assert before is not None
    side = int((2.5 * before) ** 0.5)
    png = _png_with_header(side, side, zlib.compress(b"\x00" * 1000), depth=1, ctype=0)
    with pytest.raises(ImageTooLargeError, match="too large to decode safely"):
        decode_image(png, DecodeLimits(max_pixels=10**10))
    assert before == Image.MAX_IMAGE_PIXELS  # Pillow's global untouched


def test_idat_that_inflates_to_a_gigabyte_stays_small_in_memory(tmp_path: Path) -> None:
    """A 64×64 PNG whose IDAT inflates to 1 GiB: decoding stops at 12 KiB of pixels."""
    comp = zlib.compressobj(9)
    zeros = bytes(16 << 20)
    idat = b"".join([comp.compress(zeros) for _ in range(64)] + [comp.flush()])
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png_with_header(64, 64, idat))
    assert bomb.stat().st_size < 2 * 1024 * 1024
    script = (
        "import io, json, resource, sys\n"
        "from PIL import Image\n"
        "from facefuse.imaging.decode import decode_image\n"
        "warm = io.BytesIO()\n"
        "Image.new('RGB', (64, 64)).save(warm, 'PNG')\n"
        "decode_image(warm.getvalue())  # imports and plugins loaded before measuring\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    out = list(decode_image(sys.argv[1]).shape)\n"
        "except Exception as exc:\n"
        "    out = type(exc).__name__\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'out': out, 'grew_kib': after - before}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(bomb)], capture_output=True, text=True, check=True
    )
    report = json.loads(proc.stdout)
    assert report["out"] in ([64, 64, 3], "CorruptImageError")
    assert report["grew_kib"] < 64 * 1024  # far below the 1 GiB the stream would inflate to


def test_too_small_and_one_pixel(photo: np.ndarray) -> None:
    narrow = _save(Image.fromarray(photo[:, :15]), "PNG")
    with pytest.raises(ImageTooSmallError) as info:
        decode_image(narrow)
    assert info.value.http_status == 422
    assert decode_image(narrow, DecodeLimits(min_side=15)).shape == (80, 15, 3)
    one = _save(Image.new("RGB", (1, 1), (9, 9, 9)), "PNG")
    with pytest.raises(ImageTooSmallError):
        decode_image(one, DecodeLimits(min_side=1))


def test_limits_validate_and_come_from_settings() -> None:
    s = Settings(max_pixels=123, max_bytes=456, min_side=7)
    assert DecodeLimits.from_settings(s) == DecodeLimits(123, 456, 7)
    assert DecodeLimits() == DecodeLimits(40_000_000, 10 * 1024 * 1024, 16)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            DecodeLimits(max_pixels=bad)  # type: ignore[arg-type]  # wrong type on purpose


# --- truncation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [2, 3, 100, 0.5, 0.1])
def test_truncated_jpeg_is_corrupt(obama_bytes: bytes, cut: float) -> None:
    n = len(obama_bytes)
    end = n - int(cut) if cut >= 1 else int(n * cut)
    with pytest.raises(CorruptImageError, match=r"truncated|cut short"):
        decode_image(obama_bytes[:end])


def test_jpeg_without_eoi_is_corrupt(
    small_files: dict[str, bytes],
) -> None:
    jpeg = small_files["jpeg"]
    assert jpeg.endswith(b"\xff\xd9")
    with pytest.raises(CorruptImageError, match="end-of-image"):
        decode_image(jpeg[:-2])


@pytest.mark.parametrize(
    "end",
    [
        lambda n: n - 12,  # IEND missing (Pillow alone accepts this)
        lambda n: n - 20,  # last IDAT's CRC cut too (Pillow alone accepts this)
        lambda n: n // 2,  # half the pixel data
        lambda n: 30,  # inside the IHDR chunk
    ],
    ids=["no-iend", "idat-crc", "half", "header"],
)
def test_truncated_png_is_corrupt(sample_paths: dict[str, Path], end: Callable[[int], int]) -> None:
    data = sample_paths["astronaut"].read_bytes()
    with pytest.raises(CorruptImageError):
        decode_image(data[: end(len(data))])


@pytest.mark.parametrize("key", ["webp", "webp_lossless"])
@pytest.mark.parametrize("fraction", [0.99, 0.5])
def test_truncated_webp_is_corrupt(
    small_files: dict[str, bytes], key: str, fraction: float
) -> None:
    data = small_files[key]
    with pytest.raises(CorruptImageError):
        decode_image(data[: int(len(data) * fraction)])


def test_corrupt_pixel_data_is_reported(small_files: dict[str, bytes]) -> None:
    png = bytearray(small_files["png"])
    start = png.index(b"IDAT") + 4
    png[start : start + 64] = bytes(64)  # wreck the zlib stream
    with pytest.raises(CorruptImageError):
        decode_image(bytes(png))


# --- EXIF orientation -----------------------------------------------------------------------------


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(photo: np.ndarray, orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _save(Image.fromarray(photo), "PNG", exif=exif.tobytes())
    with Image.open(io.BytesIO(data)) as im:
        assert im.getexif().get(0x0112) == orientation
        expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    out = decode_image(data)
    np.testing.assert_array_equal(out, expected)
    assert out.flags.c_contiguous
    if orientation >= 5:
        assert out.shape == (96, 80, 3)


def test_jpeg_exif_rotation(photo: np.ndarray) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display turns it 90° clockwise
    data = _save(Image.fromarray(photo), "JPEG", quality=95, exif=exif.tobytes())
    out = decode_image(data)
    assert out.shape == (96, 80, 3)
    plain = decode_image(_save(Image.fromarray(photo), "JPEG", quality=95))
    np.testing.assert_array_equal(out, np.rot90(plain, -1))


# --- modes ----------------------------------------------------------------------------------------


def test_grayscale_and_one_bit(photo: np.ndarray) -> None:
    gray = Image.fromarray(photo).convert("L")
    out = decode_image(_save(gray, "PNG"))
    g = np.asarray(gray)
    np.testing.assert_array_equal(out, np.stack([g, g, g], axis=2))
    bits = gray.point(lambda v: 255 if v > 128 else 0).convert("1")
    out1 = decode_image(_save(bits, "PNG"))
    assert set(np.unique(out1).tolist()) <= {0, 255}
    np.testing.assert_array_equal(out1[..., 0] == 255, np.asarray(bits))


def test_rgba_is_composited_over_white(photo: np.ndarray) -> None:
    rgba = np.dstack([photo, np.zeros(photo.shape[:2], np.uint8)])
    rgba[:, :40, 3] = 255
    rgba[:, 40:60, 3] = 128
    out = decode_image(_save(Image.fromarray(rgba, "RGBA"), "PNG"))
    np.testing.assert_array_equal(out[:, :40], photo[:, :40])
    np.testing.assert_array_equal(out[:, 60:], 255)
    half = (photo[:, 40:60].astype(int) * 128 + 255 * 127 + 127) // 255
    np.testing.assert_array_equal(out[:, 40:60], half)
    # The same rule for an RGBA array input.
    np.testing.assert_array_equal(decode_image(rgba), out)


def test_la_and_palette_transparency(photo: np.ndarray) -> None:
    la = Image.fromarray(photo).convert("LA")
    alpha = np.full(photo.shape[:2], 255, np.uint8)
    alpha[:10] = 0
    la.putalpha(Image.fromarray(alpha))
    out = decode_image(_save(la, "PNG"))
    np.testing.assert_array_equal(out[:10], 255)
    g = np.asarray(la)[10:, :, 0]
    np.testing.assert_array_equal(out[10:], np.stack([g, g, g], axis=2))

    pal = Image.new("P", (32, 32), 0)
    pal.putpalette([10, 20, 30, 200, 0, 0] + [0] * 762)
    pal.paste(1, (0, 0, 16, 32))
    plain = decode_image(_save(pal, "PNG"))
    np.testing.assert_array_equal(plain[:, :16], np.broadcast_to([200, 0, 0], (32, 16, 3)))
    np.testing.assert_array_equal(plain[:, 16:], np.broadcast_to([10, 20, 30], (32, 16, 3)))
    trans = decode_image(_save(pal, "PNG", transparency=0))
    np.testing.assert_array_equal(trans[:, 16:], 255)  # index 0 transparent → white
    np.testing.assert_array_equal(trans[:, :16], plain[:, :16])


def test_rgb_colour_key_transparency() -> None:
    arr = np.zeros((20, 20, 3), np.uint8)
    arr[:, 10:] = (1, 2, 3)
    arr[:, :10] = (50, 60, 70)
    data = _save(Image.fromarray(arr), "PNG", transparency=(1, 2, 3))
    out = decode_image(data, DecodeLimits(min_side=16))
    np.testing.assert_array_equal(out[:, 10:], 255)
    np.testing.assert_array_equal(out[:, :10], arr[:, :10])


def test_sixteen_bit_gray_is_scaled_not_clipped() -> None:
    values = np.array([0, 257, 32768, 40000, 65535], dtype=np.uint16)
    arr = np.tile(values, (20, 4))  # (20, 20)
    data = _save(Image.fromarray(arr), "PNG")
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode.startswith("I")
        assert im.convert("L").getextrema()[1] == 255  # Pillow clips: 40000 → 255
    out = decode_image(data)
    expected = np.round(arr / 257.0).astype(np.uint8)
    np.testing.assert_array_equal(out[..., 0], expected)
    assert out[0, :5, 1].tolist() == [0, 1, 128, 156, 255]


def test_sixteen_bit_rgb_keeps_the_high_byte() -> None:
    import cv2

    rng = np.random.default_rng(5)
    rgb16 = rng.integers(0, 65536, (24, 24, 3), dtype=np.uint16)
    ok, enc = cv2.imencode(".png", rgb16[..., ::-1])
    assert ok
    out = decode_image(enc.tobytes())
    np.testing.assert_array_equal(out, (rgb16 >> 8).astype(np.uint8))


def test_cmyk_jpeg(photo: np.ndarray) -> None:
    cmyk = Image.fromarray(photo).convert("CMYK")
    data = _save(cmyk, "JPEG", quality=95)
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "CMYK"
        assert "adobe" in im.info  # Adobe APP14: the inverted-CMYK convention
    out = decode_image(data)
    assert np.abs(out.astype(int) - photo.astype(int)).mean() < 6
    red = decode_image(_save(Image.new("CMYK", (16, 16), (0, 255, 255, 0)), "JPEG"))
    assert np.abs(red.astype(int) - [255, 0, 0]).max() <= 3


# --- arrays and types -----------------------------------------------------------------------------


def test_array_inputs(photo: np.ndarray) -> None:
    out = decode_image(photo)
    np.testing.assert_array_equal(out, photo)
    assert not np.shares_memory(out, photo)
    gray = photo[..., 1]
    np.testing.assert_array_equal(decode_image(gray), np.stack([gray] * 3, axis=2))
    np.testing.assert_array_equal(decode_image(gray[..., None]), np.stack([gray] * 3, axis=2))
    flipped = photo[:, ::-1]
    assert decode_image(flipped).flags.c_contiguous
    with pytest.raises(InvalidImageError, match="uint8"):
        decode_image(photo.astype(np.float32))
    with pytest.raises(InvalidImageError, match=r"must be \(H, W\)"):
        decode_image(np.zeros((20, 20, 2), np.uint8))
    with pytest.raises(ImageTooSmallError):
        decode_image(np.zeros((8, 40, 3), np.uint8))
    with pytest.raises(ImageTooLargeError):
        decode_image(photo, DecodeLimits(max_pixels=100))


def test_shared_array_inputs_are_checked_not_copied(photo: np.ndarray) -> None:
    assert decode_image(photo, share=True) is photo
    flipped = photo[:, ::-1]  # not C-contiguous: a copy
    out = decode_image(flipped, share=True)
    assert out.flags.c_contiguous and not np.shares_memory(out, photo)
    np.testing.assert_array_equal(out, flipped)
    assert not np.shares_memory(decode_image(photo[..., 1], share=True), photo)
    with pytest.raises(ImageTooLargeError):
        decode_image(photo, DecodeLimits(max_pixels=100), share=True)


def test_other_types_are_argument_errors() -> None:
    with pytest.raises(InvalidArgumentError):
        decode_image(12345)  # type: ignore[arg-type]  # wrong type on purpose


# --- properties -----------------------------------------------------------------------------------

_MAGICS = [
    b"",
    b"\xff\xd8\xff",
    b"\xff\xd8\xff\xe0",
    b"\x89PNG\r\n\x1a\n",
    b"RIFF\x00\x01\x00\x00WEBP",
]


@settings(max_examples=300, deadline=None)
@given(prefix=st.sampled_from(_MAGICS), tail=st.binary(max_size=400))
def test_random_bytes_raise_only_facefuse_errors(prefix: bytes, tail: bytes) -> None:
    try:
        out = decode_image(prefix + tail, DecodeLimits(min_side=1))
    except InvalidImageError:  # any other exception fails the test
        return
    assert out.dtype == np.uint8
    assert out.shape[2:] == (3,)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_real_files_raise_only_facefuse_errors(
    small_files: dict[str, bytes], data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(sorted(small_files)))
    blob = bytearray(small_files[key])
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    end = data.draw(st.integers(1, len(blob)))
    try:
        out = decode_image(bytes(blob[:end]))
    except InvalidImageError:  # any other exception fails the test
        return
    assert out.dtype == np.uint8
    assert out.shape[2:] == (3,)


@settings(max_examples=60, deadline=None)
@given(
    h=st.integers(16, 40),
    w=st.integers(16, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_png_round_trip_is_exact(h: int, w: int, seed: int) -> None:
    from facefuse.imaging.encode import encode_image

    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    np.testing.assert_array_equal(decode_image(encode_image(rgb, "png")), rgb)


def test_no_pillow_global_is_changed() -> None:
    from PIL import ImageFile

    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    assert Image.MAX_IMAGE_PIXELS == 1024 * 1024 * 1024 // 4 // 3  # Pillow's default


@pytest.mark.parametrize("cut", [0.3, 0.5, 0.9])
def test_truncated_jpeg_with_an_end_marker_appended_is_corrupt(
    obama_bytes: bytes, cut: float
) -> None:
    """The end marker is there, but the scan data stops early: libjpeg would fill the
    rest with grey; it must be refused instead."""
    data = obama_bytes[: int(len(obama_bytes) * cut)] + b"\xff\xd9"
    with pytest.raises(CorruptImageError, match="truncated"):
        decode_image(data)


# --- the one-pass JPEG decoder --------------------------------------------------------------------


@pytest.mark.parametrize("subsampling", [0, 1, 2])
def test_colour_jpegs_decode_to_pillows_pixels(
    sample_paths: dict[str, Path], subsampling: int
) -> None:
    """Colour JPEGs take libjpeg-turbo's one pass; the pixels are Pillow's, exactly."""
    for name in ("obama", "astronaut", "biden"):
        with Image.open(sample_paths[name]) as im:
            data = _save(im.convert("RGB"), "JPEG", quality=85, subsampling=subsampling)
        with Image.open(io.BytesIO(data)) as im:
            expected = np.asarray(im.convert("RGB"))
        np.testing.assert_array_equal(decode_image(data), expected)


def test_an_exif_rotated_jpeg_is_upright_on_the_one_pass_path(photo: np.ndarray) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _save(Image.fromarray(photo), "JPEG", quality=95, exif=exif.tobytes())
    with Image.open(io.BytesIO(data)) as im:
        expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    np.testing.assert_array_equal(decode_image(data), expected)
