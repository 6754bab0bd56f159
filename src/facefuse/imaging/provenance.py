"""Provenance marks of a synthetic image: machine-readable XMP and a visible label.

1. Every fused output carries an XMP packet (written by
   :func:`facefuse.imaging.encode.encode_image`) with two statements and nothing
   else — no input metadata travels (privacy):

   * ``Iptc4xmpExt:DigitalSourceType`` = IPTC's ``compositeSynthetic`` (a
     composite that includes synthetic elements: a real photo whose face was
     replaced by generated pixels);
   * ``xmp:CreatorTool`` = the software agent, ``facefuse <version>``.

   JPEG: an APP1 ``http://ns.adobe.com/xap/1.0/`` segment right after JFIF APP0;
   PNG: an uncompressed ``iTXt`` chunk ``XML:com.adobe.xmp``; WebP: the ``XMP ``
   chunk of the extended (VP8X) container. Any XMP reader (exiftool, exiv2) reads it.
2. :func:`draw_label` stamps an optional visible label ("AI-generated") in a corner:
   white text on a near-black plate, so the contrast is the same on light and
   dark photos.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from xml.sax.saxutils import quoteattr

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageDraw, ImageFont

from facefuse.config import LABEL_CORNERS, LabelCorner

#: IPTC digital source type of a photo with a generated face in it.
COMPOSITE_SYNTHETIC: Final = "http://cv.iptc.org/newscodes/digitalsourcetype/compositeSynthetic"
#: IPTC digital source type of an image wholly made by a generative model.
TRAINED_ALGORITHMIC_MEDIA: Final = (
    "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia")
#: The JPEG APP1 identifier of an XMP packet.
XMP_JPEG_ID: Final = b"http://ns.adobe.com/xap/1.0/\x00"
#: The PNG iTXt keyword of an XMP packet.
XMP_PNG_KEY: Final = "XML:com.adobe.xmp"

Corner = LabelCorner
CORNERS = LABEL_CORNERS


def software_version() -> str:
    """The installed facefuse version (from the package metadata, not the top-level
    package, which this low layer must not import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("facefuse")
    except PackageNotFoundError:
        return "unknown"


def software_agent() -> str:
    """``facefuse <version>``."""
    return f"facefuse {software_version()}"


@dataclass(frozen=True)
class Provenance:
    """What the output says about how it was made."""

    source_type: str = COMPOSITE_SYNTHETIC
    agent: str = ""

    def xmp(self) -> bytes:
        """The XMP packet (UTF-8), as every format embeds it."""
        agent = self.agent or software_agent()
        return (
            '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>\n'
            '<x:xmpmeta xmlns:x="adobe:ns:meta/">\n'
            ' <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">\n'
            '  <rdf:Description rdf:about=""\n'
            '    xmlns:Iptc4xmpExt="http://iptc.org/std/Iptc4xmpExt/2008-02-29/"\n'
            '    xmlns:xmp="http://ns.adobe.com/xap/1.0/"\n'
            f"    Iptc4xmpExt:DigitalSourceType={quoteattr(self.source_type)}\n"
            f"    xmp:CreatorTool={quoteattr(agent)}/>\n"
            " </rdf:RDF>\n"
            "</x:xmpmeta>\n"
            '<?xpacket end="r"?>'
        ).encode()


def jpeg_with_xmp(jpeg: bytes, xmp: bytes) -> bytes:
    """``jpeg`` with an XMP APP1 segment after SOI and any APP0 (JFIF) segment."""
    payload = XMP_JPEG_ID + xmp
    if len(payload) + 2 > 0xFFFF:
        raise ValueError("XMP packet too large for one JPEG segment")
    if jpeg[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG stream")
    pos = 2
    if jpeg[2:4] == b"\xff\xe0":  # keep JFIF first, as readers expect
        pos = 4 + int.from_bytes(jpeg[4:6], "big")
    segment = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    return jpeg[:pos] + segment + jpeg[pos:]


# --- the visible label ----------------------------------------------------------------

#: Default label text.
DEFAULT_LABEL: Final = "AI-generated"
#: Plate colour (RGB) and opacity, and the text colour: white on near-black gives a
#: contrast ratio above 15:1 on the plate itself, whatever lies beneath it.
PLATE_RGB: Final = (16, 16, 16)
PLATE_ALPHA: Final = 0.78
TEXT_RGB: Final = (255, 255, 255)


def draw_label(
    rgb: npt.NDArray[np.uint8], text: str = DEFAULT_LABEL, *, corner: Corner = "bottom-right",
    scale: float = 0.035,
) -> npt.NDArray[np.uint8]:
    """A copy of ``rgb`` (H, W, 3) uint8 with ``text`` on a plate in ``corner``.

    ``scale``: the text height as a fraction of the image's shorter side (at least
    10 px). The plate pads the text by half its height and sits that far from the edges.
    """
    h, w = rgb.shape[:2]
    size = max(10, round(min(h, w) * scale))
    font = ImageFont.load_default(size=size)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    x0, y0, x1, y1 = probe.textbbox((0, 0), text, font=font)
    pad = max(3, size // 2)
    bw, bh = min(w, x1 - x0 + 2 * pad), min(h, y1 - y0 + 2 * pad)
    margin = max(0, min(pad, (w - bw) // 2, (h - bh) // 2))
    left = w - bw - margin if corner.endswith("right") else margin
    top = h - bh - margin if corner.startswith("bottom") else margin
    out = np.array(rgb, copy=True)
    region = out[top:top + bh, left:left + bw].astype(np.float32)
    region = region * (1 - PLATE_ALPHA) + np.asarray(PLATE_RGB, np.float32) * PLATE_ALPHA
    plate = Image.fromarray(np.clip(np.rint(region), 0, 255).astype(np.uint8))
    ImageDraw.Draw(plate).text((pad - x0, pad - y0), text, font=font, fill=TEXT_RGB)
    out[top:top + bh, left:left + bw] = np.asarray(plate)
    return out
