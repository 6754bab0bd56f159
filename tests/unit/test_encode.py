"""encode_image: formats, quality, validation, and no metadata in the output."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageCms

from facefuse.errors import InvalidArgumentError
from facefuse.imaging.decode import decode_image
from facefuse.imaging.encode import content_type, encode_image, format_from_path


@pytest.fixture(scope="module")
def face(sample_images: dict[str, np.ndarray]) -> np.ndarray:
    """A 200×160 crop of a real photo."""
    return np.ascontiguousarray(sample_images["obama"][150:350, 300:460])


@pytest.fixture(scope="module")
def tagged_jpeg(face: np.ndarray) -> bytes:
    """A JPEG carrying EXIF (camera, GPS-ish text), an ICC profile and a comment."""
    exif = Image.Exif()
    exif[0x010F] = "SecretCam"  # Make
    exif[0x0131] = "leaky-software 1.0"  # Software
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    buf = io.BytesIO()
    Image.fromarray(face).save(
        buf, "JPEG", quality=95, exif=exif.tobytes(), icc_profile=icc, comment=b"secret note"
    )
    return buf.getvalue()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float(10 * np.log10(255.0**2 / max(mse, 1e-12)))


def _jpeg_markers(data: bytes) -> list[int]:
    """Marker codes before the first scan."""
    markers, pos = [], 2
    while pos < len(data):
        assert data[pos] == 0xFF
        marker = data[pos + 1]
        markers.append(marker)
        if marker == 0xDA:
            break
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        pos += 2 + length
    return markers


def _png_chunks(data: bytes) -> list[bytes]:
    chunks, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        chunks.append(data[pos + 4 : pos + 8])
        pos += 12 + length
    return chunks


def _riff_chunks(data: bytes) -> list[bytes]:
    chunks, pos = [], 12
    while pos + 8 <= len(data):
        fourcc = data[pos : pos + 4]
        (length,) = struct.unpack("<I", data[pos + 4 : pos + 8])
        chunks.append(fourcc)
        pos += 8 + length + (length & 1)
    return chunks


def test_png_round_trip_is_exact(face: np.ndarray) -> None:
    np.testing.assert_array_equal(decode_image(encode_image(face, "png")), face)


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
def test_lossy_formats_are_close_and_quality_matters(face: np.ndarray, fmt: str) -> None:
    hi = encode_image(face, fmt, quality=95)
    lo = encode_image(face, fmt, quality=20)
    assert len(lo) < len(hi)
    assert _psnr(decode_image(hi), face) > 35.0
    assert _psnr(decode_image(hi), face) > _psnr(decode_image(lo), face)


def test_magic_bytes_match_the_format(face: np.ndarray) -> None:
    assert encode_image(face).startswith(b"\xff\xd8\xff")
    assert encode_image(face, "jpg").startswith(b"\xff\xd8\xff")
    assert encode_image(face, "PNG").startswith(b"\x89PNG\r\n\x1a\n")
    webp = encode_image(face, "webp")
    assert webp[:4] == b"RIFF"
    assert webp[8:12] == b"WEBP"


def test_no_metadata_survives_a_round_trip(tagged_jpeg: bytes) -> None:
    with Image.open(io.BytesIO(tagged_jpeg)) as im:  # the input really carries metadata
        assert "icc_profile" in im.info
        assert im.getexif().get(0x010F) == "SecretCam"
    rgb = decode_image(tagged_jpeg)

    jpeg = encode_image(rgb, "jpeg")
    markers = _jpeg_markers(jpeg)
    assert 0xE1 not in markers  # APP1: EXIF / XMP
    assert 0xE2 not in markers  # APP2: ICC
    assert 0xFE not in markers  # COM
    assert b"SecretCam" not in jpeg

    png = encode_image(rgb, "png")
    assert set(_png_chunks(png)) == {b"IHDR", b"IDAT", b"IEND"}

    webp = encode_image(rgb, "webp")
    assert _riff_chunks(webp) == [b"VP8 "]

    for data in (jpeg, png, webp):
        with Image.open(io.BytesIO(data)) as im:
            assert "exif" not in im.info
            assert "icc_profile" not in im.info
            assert len(im.getexif()) == 0


def test_strided_input(face: np.ndarray) -> None:
    mirrored = face[:, ::-1]
    assert not mirrored.flags.c_contiguous
    np.testing.assert_array_equal(decode_image(encode_image(mirrored, "png")), mirrored)


@pytest.mark.parametrize("quality", [0, 101, -5, 1.5, True, "90"])
def test_quality_is_validated(face: np.ndarray, quality: object) -> None:
    with pytest.raises(InvalidArgumentError, match="quality"):
        encode_image(face, "jpeg", quality)  # type: ignore[arg-type]  # wrong type on purpose


@pytest.mark.parametrize("quality", [1, 100])
def test_quality_bounds_are_inclusive(face: np.ndarray, quality: int) -> None:
    assert decode_image(encode_image(face, "jpeg", quality)).shape == face.shape
    assert decode_image(encode_image(face, "png", quality)).shape == face.shape


def test_bad_arrays_and_formats(face: np.ndarray) -> None:
    with pytest.raises(InvalidArgumentError, match="uint8"):
        encode_image(face.astype(np.float32))
    with pytest.raises(InvalidArgumentError, match=r"\(H, W, 3\)"):
        encode_image(face[..., 0])
    with pytest.raises(InvalidArgumentError, match=r"\(H, W, 3\)"):
        encode_image(np.dstack([face, face[..., :1]]))
    with pytest.raises(InvalidArgumentError, match="format"):
        encode_image(face, "gif")


def test_content_type_and_format_from_path() -> None:
    assert content_type("jpeg") == "image/jpeg"
    assert content_type("JPG") == "image/jpeg"
    assert content_type("png") == "image/png"
    assert content_type("webp") == "image/webp"
    with pytest.raises(InvalidArgumentError):
        content_type("bmp")
    assert format_from_path(Path("out/x.JPG")) == "jpeg"
    assert format_from_path("a.jpeg") == "jpeg"
    assert format_from_path("a.png") == "png"
    assert format_from_path("a.webp") == "webp"
    with pytest.raises(InvalidArgumentError, match=r"\.tiff"):
        format_from_path("a.tiff")
