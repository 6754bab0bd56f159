"""Safe image decoding: bytes, a file or an array in, upright RGB ``uint8`` out.

Every input image crosses this boundary, so it is strict and cheap to refuse:

1. size in bytes (``max_bytes``; for a file, checked with ``stat`` before reading);
2. format by magic bytes — JPEG, PNG and WebP only, whatever the file is called;
3. width and height read from the header by our own parser, *before* Pillow sees
   the data, and checked against ``max_pixels`` and ``min_side`` — a header that
   claims 50000×50000 is refused without allocating anything;
4. completeness — a JPEG must end with an EOI marker after its frame header and
   its scan data must not end early (checked by libjpeg-turbo in strict mode, so a
   truncated file with an EOI appended is refused), a PNG must have its IEND
   chunk, a WebP its whole RIFF payload; Pillow is used
   with its default ``LOAD_TRUNCATED_IMAGES = False`` (never changed here), so a
   short pixel stream is an error too;
5. decoding by the one Pillow plugin the magic bytes named (``formats=[...]``);
   colour JPEGs are then decoded in one strict libjpeg-turbo pass (``simplejpeg``:
   the same pixels, faster, the scan check included), Pillow reading only their
   header and EXIF.
   Pillow's own decompression-bomb guard (``Image.MAX_IMAGE_PIXELS``, left as it
   is) still applies on top and its ``DecompressionBombError`` becomes
   :class:`~facefuse.errors.ImageTooLargeError`. PNG pixel data inflates into a
   buffer of the header's size and Pillow stops reading when it is full, so an
   IDAT stream that would inflate to gigabytes costs no more memory than the
   (already limited) image itself;
6. EXIF orientation applied (the result is upright);
7. every mode turned into RGB: transparency (alpha, palette or ``tRNS`` colour
   key) is composited over **white**; 16-bit greyscale is scaled (``v / 257``,
   rounded), not clipped; 16-bit colour PNGs keep their high byte (Pillow);
   CMYK JPEGs (Adobe-inverted included) and 1-bit images are converted by Pillow.

All failures are :class:`~facefuse.errors.InvalidImageError` subclasses.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
import simplejpeg
from PIL import Image

from facefuse.errors import (
    CorruptImageError,
    EmptyImageError,
    ImageTooLargeError,
    ImageTooSmallError,
    InvalidArgumentError,
    InvalidImageError,
    UnsupportedFormatError,
)

ImageFormat = Literal["jpeg", "png", "webp"]

#: Everything :func:`decode_image` accepts: encoded bytes, a file path, or an array.
ImageInput = bytes | bytearray | memoryview | str | os.PathLike[str] | np.ndarray

#: Formats accepted by :func:`decode_image`, in the names :mod:`encode` uses too.
SUPPORTED_FORMATS: tuple[ImageFormat, ...] = ("jpeg", "png", "webp")

_PIL_NAMES: dict[ImageFormat, str] = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: Magic bytes of formats we refuse, only to name them in the error message.
_KNOWN_OTHERS: tuple[tuple[bytes, str], ...] = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"%PDF", "PDF"),
    (b"8BPS", "PSD"),
    (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", "JPEG XL"),
    (b"\x97JB2", "JBIG2"),
)

# Errors Pillow (and the stdlib helpers it uses) raise on malformed data.
_PIL_DATA_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # includes PIL.UnidentifiedImageError and "image file is truncated"
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    KeyError,
    TypeError,
    struct.error,
    zlib.error,
)


class _SettingsLike(Protocol):
    @property
    def max_pixels(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def min_side(self) -> int: ...


@dataclass(frozen=True)
class DecodeLimits:
    """Limits every decoded image must satisfy.

    Attributes:
        max_pixels: most pixels (width × height) an image may have.
        max_bytes: most encoded bytes accepted (bytes input or file size).
        min_side: fewest pixels the shorter side may have; a 1×1 image is
            always refused.
    """

    max_pixels: int = 40_000_000
    max_bytes: int = 10 * 1024 * 1024
    min_side: int = 16

    def __post_init__(self) -> None:
        for name in ("max_pixels", "max_bytes", "min_side"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(
                    f"DecodeLimits.{name} must be a positive int, not {value!r}"
                )

    @classmethod
    def from_settings(cls, settings: _SettingsLike) -> DecodeLimits:
        """The limits of a :class:`facefuse.config.Settings` (or anything with
        ``max_pixels``, ``max_bytes`` and ``min_side``)."""
        return cls(
            max_pixels=settings.max_pixels,
            max_bytes=settings.max_bytes,
            min_side=settings.min_side,
        )


@dataclass(frozen=True)
class ImageInfo:
    """What the header says.

    ``width`` and ``height`` are the stored (coded) dimensions in pixels, before
    any EXIF orientation; a 90° orientation swaps them in the decoded array, the
    pixel count is the same.
    """

    format: ImageFormat
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


# --- header parsing -------------------------------------------------------------------


def sniff_format(data: bytes) -> ImageFormat:
    """The format named by the first bytes of ``data``.

    Raises:
        EmptyImageError: ``data`` is empty.
        UnsupportedFormatError: anything but JPEG, PNG or WebP.
    """
    if len(data) == 0:
        raise EmptyImageError("the image is empty (0 bytes)")
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == _PNG_SIGNATURE:
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    name = "an unknown format"
    for magic, label in _KNOWN_OTHERS:
        if data.startswith(magic):
            name = label
            break
    else:
        if data[4:8] == b"ftyp":
            name = "HEIF/AVIF/MP4"
        elif data[:4] == b"RIFF":
            name = "RIFF (not WebP)"
        elif _looks_like_text(data[:512]):
            name = "text"
    raise UnsupportedFormatError(f"unsupported image format: {name}; send JPEG, PNG or WebP")


def _looks_like_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def probe_image(data: bytes) -> ImageInfo:
    """Format and stored size from the header alone; no pixel is decoded.

    Args:
        data: the encoded image (only its first bytes are read for PNG and WebP;
            JPEG markers are walked up to the frame header).

    Raises:
        EmptyImageError, UnsupportedFormatError: see :func:`sniff_format`.
        CorruptImageError: the header is cut short or malformed.
    """
    data = bytes(data) if not isinstance(data, bytes) else data
    fmt = sniff_format(data)
    if fmt == "png":
        width, height = _png_size(data)
    elif fmt == "jpeg":
        width, height, _ = _jpeg_frame(data)
    else:
        width, height = _webp_size(data)
    if width <= 0 or height <= 0:
        raise CorruptImageError(f"the {fmt.upper()} header gives an empty size {width}×{height}")
    return ImageInfo(format=fmt, width=width, height=height)


def _png_size(data: bytes) -> tuple[int, int]:
    # signature(8) length(4) "IHDR"(4) width(4) height(4) depth colour compression filter interlace
    if len(data) < 33:
        raise CorruptImageError("the PNG is cut short before the end of its IHDR header")
    length, ctype = struct.unpack(">I4s", data[8:16])
    if ctype != b"IHDR" or length != 13:
        raise CorruptImageError("the PNG does not start with a valid IHDR chunk")
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


# SOFn markers (frame headers) — every C0..CF except DHT (C4), JPG (C8) and DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM, RSTn, SOI (EOI ends the walk).
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8), 0xD8})


def _jpeg_frame(data: bytes) -> tuple[int, int, int]:
    """Walk the JPEG markers to the first SOFn; return (width, height, offset after it)."""
    n = len(data)
    pos = 2
    while True:
        if pos >= n:
            raise CorruptImageError("the JPEG is cut short before its frame header")
        if data[pos] != 0xFF:
            raise CorruptImageError(f"the JPEG has garbage instead of a marker at byte {pos}")
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            raise CorruptImageError("the JPEG is cut short before its frame header")
        marker = data[pos]
        pos += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker in (0xD9, 0xDA):
            raise CorruptImageError("the JPEG has no frame header before its scan data")
        if pos + 2 > n:
            raise CorruptImageError("the JPEG is cut short inside a marker")
        (length,) = struct.unpack(">H", data[pos : pos + 2])
        if length < 2:
            raise CorruptImageError("the JPEG has a marker segment with a bad length")
        if marker in _JPEG_SOF:
            if length < 8 or pos + 7 > n:
                raise CorruptImageError("the JPEG frame header is cut short")
            height, width = struct.unpack(">HH", data[pos + 3 : pos + 7])
            if height == 0:
                # Height defined later by a DNL marker: legal, practically unused.
                raise CorruptImageError("the JPEG frame header gives no height (DNL)")
            return int(width), int(height), pos + length
        pos += length


def _webp_size(data: bytes) -> tuple[int, int]:
    if len(data) < 30:
        raise CorruptImageError("the WebP is cut short before its bitstream header")
    fourcc = data[12:16]
    payload = data[20:]
    if fourcc == b"VP8 ":
        # 3-byte frame tag (bit 0 = 0 for a key frame), start code 9d 01 2a, 14-bit sizes.
        if payload[0] & 1 or payload[3:6] != b"\x9d\x01\x2a":
            raise CorruptImageError("the WebP (lossy) key frame header is invalid")
        w, h = struct.unpack("<HH", payload[6:10])
        return w & 0x3FFF, h & 0x3FFF
    if fourcc == b"VP8L":
        if payload[0] != 0x2F:
            raise CorruptImageError("the WebP (lossless) signature is invalid")
        (bits,) = struct.unpack("<I", payload[1:5])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if fourcc == b"VP8X":
        w = int.from_bytes(payload[4:7], "little") + 1
        h = int.from_bytes(payload[7:10], "little") + 1
        return w, h
    raise CorruptImageError(f"the WebP has an unknown first chunk {fourcc!r}")


# --- limits and completeness -----------------------------------------------------------


def _check_bytes(n: int, limits: DecodeLimits) -> None:
    if n == 0:
        raise EmptyImageError("the image is empty (0 bytes)")
    if n > limits.max_bytes:
        raise ImageTooLargeError(f"the image is {n} bytes; the limit is {limits.max_bytes} bytes")


def _check_size(width: int, height: int, limits: DecodeLimits) -> None:
    if width * height > limits.max_pixels:
        raise ImageTooLargeError(
            f"the image is {width}×{height} = {width * height} pixels; "
            f"the limit is {limits.max_pixels} pixels"
        )
    if min(width, height) < limits.min_side or width * height <= 1:
        raise ImageTooSmallError(
            f"the image is {width}×{height} pixels; each side must be at least {limits.min_side}"
        )


def check_header(data: bytes, limits: DecodeLimits) -> ImageInfo:
    """Format allow-list and pixel limits from the header alone (cheap; no decoding).

    Raises the typed errors :func:`decode_image` would (empty, unsupported format,
    corrupt header, too large, too small), so a bomb or a 50000×50000 header can be
    refused before any pixel is decoded.
    """
    info = probe_image(data)
    _check_size(info.width, info.height, limits)
    return info


def check_encoded(data: bytes, limits: DecodeLimits) -> ImageInfo:
    """Everything :func:`decode_image` checks of encoded bytes before it decodes a
    pixel: the byte count, the format allow-list, the header, the pixel limits and
    that the file is whole (its end is there). For a door that keeps images to
    decode later (a queued job) with the typed errors a decode would give.
    """
    _check_bytes(len(data), limits)
    info = check_header(data, limits)
    _check_complete(data, info.format)
    return info


def _check_complete(data: bytes, fmt: ImageFormat) -> None:
    """Refuse files whose end is missing (Pillow alone lets some of these through)."""
    if fmt == "jpeg":
        _, _, after_sof = _jpeg_frame(data)
        if data.rfind(b"\xff\xd9", after_sof) < 0:
            raise CorruptImageError("the JPEG is truncated (no end-of-image marker)")
    elif fmt == "png":
        if data.rfind(b"\x00\x00\x00\x00IEND", 33) < 0:
            raise CorruptImageError("the PNG is truncated (no IEND chunk)")
    else:
        (riff_size,) = struct.unpack("<I", data[4:8])
        if len(data) < riff_size + 8:
            raise CorruptImageError(f"the WebP is truncated ({len(data)} of {riff_size + 8} bytes)")


def _check_jpeg_scan(data: bytes) -> None:
    """Refuse a JPEG whose entropy-coded data ends early (a truncated file with an
    end marker appended: Pillow's libjpeg silently fills the rest with grey).

    libjpeg-turbo (``simplejpeg``, strict) decodes the whole scan at 1/8 scale, in
    grey — cheap, since only DC coefficients are transformed — and reports the
    premature end that Pillow's decoder ignores. Other libjpeg warnings (e.g.
    extraneous bytes before a marker, common in camera files) are left to Pillow.
    """
    try:
        simplejpeg.decode_jpeg(data, colorspace="gray", strict=True, min_height=1, min_width=1)
    except ValueError as exc:
        _raise_if_truncated(exc)


def _raise_if_truncated(exc: ValueError) -> None:
    """libjpeg-turbo's strict-mode error → CorruptImageError when the scan ends early."""
    if "premature end" in str(exc).lower():
        raise CorruptImageError(
            "the JPEG is truncated (its scan data ends before the image is complete)"
        ) from None


def _decode_jpeg_rgb(data: bytes) -> U8 | None:
    """A colour JPEG in one libjpeg-turbo pass (``simplejpeg``, strict): (H, W, 3)
    uint8, the same pixels as Pillow's decoder (both libjpeg-turbo, islow DCT, fancy
    upsampling) in about 60 % of its time, and the scan checked in the same pass.
    None when libjpeg warns of anything but a premature end (left to Pillow).
    """
    try:
        rgb: U8 = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    except ValueError as exc:
        _raise_if_truncated(exc)
        return None
    return rgb


# --- pixels ------------------------------------------------------------------------------

U8 = npt.NDArray[np.uint8]


def _composite_white(rgb: U8, alpha: U8) -> U8:
    """``rgb·a + 255·(1−a)`` with ``a = alpha/255``, rounded; (H,W,3) and (H,W) uint8."""
    a = alpha.astype(np.uint32)[..., None]
    out = (rgb.astype(np.uint32) * a + 255 * (255 - a) + 127) // 255
    return out.astype(np.uint8)


def _gray16_to_rgb(im: Image.Image) -> U8:
    raw = np.asarray(im)
    values = np.clip(raw.astype(np.int64), 0, 65535)
    gray = ((values * 255 + 32767) // 65535).astype(np.uint8)
    rgb = np.repeat(gray[..., None], 3, axis=2)
    key = im.info.get("transparency")
    if isinstance(key, int):
        alpha = np.where(values == key, 0, 255).astype(np.uint8)
        rgb = _composite_white(rgb, alpha)
    return rgb


_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})


def _to_rgb(im: Image.Image) -> U8:
    """Pillow image of any mode → (H, W, 3) uint8 RGB (transparency over white)."""
    mode = im.mode
    if mode == "RGB" and "transparency" not in im.info:
        return np.asarray(im, dtype=np.uint8)
    if mode == "I" or mode.startswith("I;16"):
        return _gray16_to_rgb(im)
    if mode in _ALPHA_MODES or im.has_transparency_data:
        rgba = np.asarray(im.convert("RGBA"), dtype=np.uint8)
        return _composite_white(rgba[..., :3], rgba[..., 3])
    return np.asarray(im.convert("RGB"), dtype=np.uint8)


_EXIF_ORIENTATION = 0x0112


def _orientation(im: Image.Image) -> int:
    try:
        value: Any = im.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # a broken EXIF block must not cost the picture
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _apply_orientation(rgb: U8, orientation: int) -> U8:
    """Upright an (H, W, 3) array stored with EXIF ``orientation`` (1..8); a view."""
    if orientation == 2:
        return rgb[:, ::-1]
    if orientation == 3:
        return rgb[::-1, ::-1]
    if orientation == 4:
        return rgb[::-1]
    if orientation == 5:
        return rgb.transpose(1, 0, 2)
    if orientation == 6:
        return np.rot90(rgb, -1)
    if orientation == 7:
        return rgb.transpose(1, 0, 2)[::-1, ::-1]
    if orientation == 8:
        return np.rot90(rgb, 1)
    return rgb


def _decode_bytes(data: bytes, limits: DecodeLimits) -> U8:
    _check_bytes(len(data), limits)
    info = probe_image(data)
    _check_size(info.width, info.height, limits)
    _check_complete(data, info.format)
    try:
        with Image.open(io.BytesIO(data), formats=[_PIL_NAMES[info.format]]) as im:
            if im.size != (info.width, info.height):
                raise CorruptImageError(
                    f"the {info.format.upper()} header says {info.width}×{info.height} "
                    f"but the decoder found {im.size[0]}×{im.size[1]}"
                )
            fast = (_decode_jpeg_rgb(data)
                    if info.format == "jpeg" and im.mode == "RGB" else None)
            if fast is None:
                if info.format == "jpeg":
                    _check_jpeg_scan(data)
                im.load()
            orientation = _orientation(im)
            rgb = _to_rgb(im) if fast is None else fast
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"the image is too large to decode safely: {exc}") from exc
    except _PIL_DATA_ERRORS as exc:
        raise CorruptImageError(
            f"the {info.format.upper()} image is corrupt or truncated: {exc}"
        ) from exc
    return _writable(_apply_orientation(rgb, orientation))


def _writable(arr: U8) -> U8:
    """A C-contiguous, writable array (Pillow hands out read-only buffers)."""
    out = np.ascontiguousarray(arr)
    return out if out.flags.writeable else out.copy()


def _decode_array(arr: np.ndarray, limits: DecodeLimits, share: bool = False) -> U8:
    if arr.dtype != np.uint8:
        raise InvalidImageError(f"an image array must be uint8, not {arr.dtype}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if arr.ndim == 2:
        _check_size(arr.shape[1], arr.shape[0], limits)
        return np.ascontiguousarray(np.repeat(arr[..., None], 3, axis=2))
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise InvalidImageError(
            f"an image array must be (H, W), (H, W, 3) or (H, W, 4), not {arr.shape}"
        )
    _check_size(arr.shape[1], arr.shape[0], limits)
    if arr.shape[2] == 4:
        return _composite_white(arr[..., :3], arr[..., 3])
    if share:
        return np.ascontiguousarray(arr)
    return np.array(arr, dtype=np.uint8, order="C", copy=True)


def _read_file(path: str | os.PathLike[str], limits: DecodeLimits) -> bytes:
    name = os.fsdecode(path)
    try:
        size = os.stat(path).st_size
        if not os.path.isfile(path):
            raise InvalidImageError(f"not a regular file: {name}")
        _check_bytes(size, limits)
        with open(path, "rb") as fh:
            data = fh.read(limits.max_bytes + 1)
    except FileNotFoundError as exc:
        raise InvalidImageError(f"image file not found: {name}") from exc
    except PermissionError as exc:
        raise InvalidImageError(f"image file not readable (permission denied): {name}") from exc
    except OSError as exc:
        raise InvalidImageError(f"cannot read image file {name}: {exc.strerror or exc}") from exc
    _check_bytes(len(data), limits)  # the file may have changed since stat
    return data


def decode_image(
    data: ImageInput,
    limits: DecodeLimits | None = None,
    *,
    share: bool = False,
) -> U8:
    """Decode an image into an upright RGB array.

    Args:
        data: encoded bytes (JPEG, PNG or WebP); a path (``str`` or
            ``os.PathLike``) to such a file; or an array — uint8 (H, W),
            (H, W, 1), (H, W, 3) RGB or (H, W, 4) RGBA (alpha over white).
        limits: size limits; default :class:`DecodeLimits()`.
        share: for callers that only read the result: an input array that
            already is C-contiguous (H, W, 3) uint8 is returned as it is (checked,
            not copied: ~0.3 ms a megapixel).

    Returns:
        (H, W, 3) uint8 RGB, C-contiguous, EXIF orientation applied, never a
        view of an input array (unless ``share``).

    Raises:
        EmptyImageError: zero bytes.
        UnsupportedFormatError: not JPEG, PNG or WebP (by content, not name).
        ImageTooLargeError: over ``max_bytes`` or ``max_pixels``.
        ImageTooSmallError: a side under ``min_side``, or 1×1.
        CorruptImageError: malformed or truncated data.
        InvalidImageError: a missing/unreadable file or a bad array.
        InvalidArgumentError: ``data`` of another type.
    """
    limits = DecodeLimits() if limits is None else limits
    if isinstance(data, np.ndarray):
        return _decode_array(data, limits, share)
    if isinstance(data, str | os.PathLike):
        return _decode_bytes(_read_file(data, limits), limits)
    if isinstance(data, bytes | bytearray | memoryview):
        return _decode_bytes(bytes(data), limits)
    raise InvalidArgumentError(
        f"decode_image takes bytes, a path or an ndarray, not {type(data).__name__}"
    )
