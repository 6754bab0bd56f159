"""Encode RGB arrays to JPEG, PNG or WebP bytes, without the input's metadata.

Nothing about the input travels in the output: no EXIF, no ICC profile, no
input XMP, no PNG text chunks — the array is re-wrapped by
:func:`PIL.Image.fromarray`, which starts with empty ``info``. The only metadata
written is our own provenance XMP when a :class:`~facefuse.imaging.provenance.Provenance`
is passed (see that module for where each format carries it). Without it, JPEG
keeps only its JFIF APP0 header and WebP is written in the simple (non-VP8X)
container.
"""

from __future__ import annotations

import io
import os
from typing import Final, Literal, cast

import numpy as np
import numpy.typing as npt
from PIL import Image, PngImagePlugin

from facefuse.errors import InvalidArgumentError
from facefuse.imaging.provenance import XMP_PNG_KEY, Provenance, jpeg_with_xmp

EncodeFormat = Literal["jpeg", "png", "webp"]

_CONTENT_TYPES: Final[dict[str, str]] = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
}
_ALIASES: Final[dict[str, str]] = {"jpg": "jpeg"}

#: zlib level for PNG (1 fastest .. 9 smallest). 2, not zlib's usual 6: at 1–2 MP
#: a fused photo costs 132 ms of CPU instead of 479 (BENCHMARKS.md, median of 8
#: portraits) for a file 15 % larger (1.58 vs 1.37 MB); levels 1–3 are zlib's fast
#: deflate, 4–9 its slow one. The pixels are the same at every level.
PNG_COMPRESS_LEVEL: Final = 2
#: libwebp effort 0 (fast) .. 6 (slow, smaller); 4 is libwebp's default.
WEBP_METHOD: Final = 4


def normalize_format(fmt: str) -> EncodeFormat:
    """``"JPEG"``, ``"jpg"`` … → ``"jpeg"``; raises :class:`InvalidArgumentError` otherwise."""
    if not isinstance(fmt, str):
        raise InvalidArgumentError(f"image format must be a string, not {type(fmt).__name__}")
    name = fmt.strip().lower()
    name = _ALIASES.get(name, name)
    if name not in _CONTENT_TYPES:
        raise InvalidArgumentError(f"image format must be jpeg, png or webp, not {fmt!r}")
    return cast(EncodeFormat, name)


_SUFFIXES: Final[dict[str, EncodeFormat]] = {
    ".jpg": "jpeg",
    ".jpeg": "jpeg",
    ".png": "png",
    ".webp": "webp",
}


def format_from_path(path: str | os.PathLike[str]) -> EncodeFormat:
    """The format named by a file's suffix (``.jpg``/``.jpeg``, ``.png``, ``.webp``,
    any case); raises :class:`InvalidArgumentError` for anything else."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    try:
        return _SUFFIXES[suffix]
    except KeyError:
        raise InvalidArgumentError(
            f"cannot tell the image format from {os.fspath(path)!r}: "
            "use a .jpg, .jpeg, .png or .webp name"
        ) from None


def content_type(fmt: str) -> str:
    """The MIME type for ``fmt`` (``"jpeg"`` → ``"image/jpeg"``)."""
    return _CONTENT_TYPES[normalize_format(fmt)]


def encode_image(
    rgb: npt.NDArray[np.uint8],
    fmt: EncodeFormat | str = "jpeg",
    quality: int = 92,
    provenance: Provenance | None = None,
) -> bytes:
    """Encode an RGB image.

    Args:
        rgb: (H, W, 3) uint8 RGB (any strides).
        fmt: ``"jpeg"`` (alias ``"jpg"``), ``"png"`` or ``"webp"``.
        quality: 1..100. JPEG and WebP lossy quality (libjpeg / libwebp scale);
            validated but unused for PNG, which is lossless.
        provenance: the XMP provenance statement to embed (fused outputs); None
            writes no metadata at all.

    Returns:
        The encoded file.

    Raises:
        InvalidArgumentError: bad format, quality, dtype or shape.
    """
    name = normalize_format(fmt)
    if isinstance(quality, bool) or not isinstance(quality, int | np.integer):
        raise InvalidArgumentError(f"quality must be an int in 1..100, not {quality!r}")
    if not 1 <= int(quality) <= 100:
        raise InvalidArgumentError(f"quality must be in 1..100, not {quality}")
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8:
        dtype = getattr(rgb, "dtype", type(rgb).__name__)
        raise InvalidArgumentError(f"encode_image needs a uint8 array, not {dtype}")
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise InvalidArgumentError(f"encode_image needs an (H, W, 3) RGB array, not {rgb.shape}")
    im = Image.fromarray(np.ascontiguousarray(rgb))
    xmp = provenance.xmp() if provenance is not None else None
    buf = io.BytesIO()
    if name == "jpeg":
        im.save(buf, format="JPEG", quality=int(quality), optimize=False)
        return jpeg_with_xmp(buf.getvalue(), xmp) if xmp else buf.getvalue()
    if name == "png":
        info = None
        if xmp:
            info = PngImagePlugin.PngInfo()
            info.add_itxt(XMP_PNG_KEY, xmp.decode(), zip=False)
        im.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL, pnginfo=info)
    elif xmp:
        im.save(buf, format="WEBP", quality=int(quality), method=WEBP_METHOD, xmp=xmp)
    else:
        im.save(buf, format="WEBP", quality=int(quality), method=WEBP_METHOD)
    return buf.getvalue()
