"""How a fused image leaves facefuse: visible label, provenance XMP, C2PA signature.

:class:`OutputPolicy` is built once from :class:`~facefuse.config.Settings` and
applied to every fused output by the library's CLI and by the server:

1. the visible label (``FACEFUSE_LABEL=true``; off by default — see docs/api.md),
2. encoding with the provenance XMP (``FACEFUSE_PROVENANCE``, on by default),
3. Content Credentials (C2PA) when ``FACEFUSE_C2PA_CERT`` and ``FACEFUSE_C2PA_KEY``
   name a PEM certificate chain and private key: a signed manifest whose actions say
   the image was created and edited by facefuse with the IPTC source type. Needs
   the ``c2pa-python`` package (the ``c2pa`` extra).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.imaging.encode import content_type, encode_image, normalize_format
from facefuse.imaging.provenance import (
    COMPOSITE_SYNTHETIC,
    Corner,
    Provenance,
    draw_label,
    software_version,
)

#: Signature algorithm by private key type (C2PA names).
_ALGS: Final = {"ec256": "es256", "ec384": "es384", "ed25519": "ed25519"}


def c2pa_manifest(source_type: str = COMPOSITE_SYNTHETIC) -> dict[str, Any]:
    """The C2PA manifest definition facefuse signs: who made it and how."""
    agent = {"name": "facefuse", "version": software_version()}
    return {
        "claim_generator_info": [agent],
        "assertions": [{"label": "c2pa.actions.v2", "data": {"actions": [
            {"action": "c2pa.created", "digitalSourceType": source_type, "softwareAgent": agent},
            {"action": "c2pa.edited", "digitalSourceType": source_type, "softwareAgent": agent,
             "description": "a face was replaced by a fused identity"},
        ]}}],
    }


class C2paSigner:
    """Signs encoded images with a C2PA manifest (``c2pa-python``).

    Args:
        cert_chain: PEM, the signing certificate first, then its issuers.
        private_key: PEM (PKCS#8) EC P-256/P-384 or Ed25519 key.
    """

    def __init__(self, cert_chain: bytes, private_key: bytes) -> None:
        try:
            import c2pa
        except ImportError:
            raise InvalidArgumentError(
                "C2PA signing is configured but c2pa-python is not installed "
                "(pip install 'facefuse[c2pa]')", code="c2pa_unavailable") from None
        self._c2pa = c2pa
        self._chain = cert_chain
        self._key = private_key
        self.alg = _algorithm(private_key)
        # No thumbnail: it would carry a copy of the picture inside the manifest.
        self._context = c2pa.Context.from_dict({"builder": {"thumbnail": {"enabled": False}}})

    @classmethod
    def from_files(cls, cert: Path, key: Path) -> C2paSigner:
        try:
            return cls(cert.read_bytes(), key.read_bytes())
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read the C2PA certificate or key: {exc}",
                                       code="c2pa_unavailable") from None

    def sign(self, data: bytes, fmt: str, source_type: str = COMPOSITE_SYNTHETIC) -> bytes:
        """``data`` (an encoded image of format ``fmt``) with an embedded signed manifest."""
        c2pa = self._c2pa
        signer = c2pa.Signer.from_info(c2pa.C2paSignerInfo(self.alg, self._chain, self._key,
                                                          None))
        builder = c2pa.Builder(c2pa_manifest(source_type), context=self._context)
        out = io.BytesIO()
        builder.sign(signer, content_type(fmt), io.BytesIO(data), out)
        return out.getvalue()


def _algorithm(private_key: bytes) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(private_key, password=None)
    except (ValueError, TypeError):
        raise InvalidArgumentError("the C2PA key is not an unencrypted PEM private key",
                                   code="c2pa_unavailable") from None
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.key_size in (256, 384):
        return _ALGS[f"ec{key.curve.key_size}"]
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return _ALGS["ed25519"]
    raise InvalidArgumentError("the C2PA key must be EC P-256, P-384 or Ed25519",
                               code="c2pa_unavailable")


@dataclass(frozen=True)
class OutputPolicy:
    """Label, provenance and signing applied to every fused output."""

    provenance: Provenance | None = field(default_factory=Provenance)
    label: str | None = None
    label_corner: Corner = "bottom-right"
    label_scale: float = 0.035
    signer: C2paSigner | None = None

    @classmethod
    def from_settings(cls, s: Settings) -> OutputPolicy:
        signer = None
        if s.c2pa_cert is not None or s.c2pa_key is not None:
            if s.c2pa_cert is None or s.c2pa_key is None:
                raise InvalidArgumentError("C2PA signing needs both c2pa_cert and c2pa_key",
                                           code="c2pa_unavailable")
            signer = C2paSigner.from_files(s.c2pa_cert, s.c2pa_key)
        return cls(provenance=Provenance() if s.provenance else None,
                   label=s.label_text if s.label else None,
                   label_corner=s.label_corner,
                   label_scale=s.label_scale, signer=signer)

    def encode(self, rgb: npt.NDArray[np.uint8], fmt: str = "jpeg", quality: int = 92) -> bytes:
        """Label (when on), encode with provenance XMP (when on), sign (when configured)."""
        name = normalize_format(fmt)
        if self.label:
            rgb = draw_label(rgb, self.label, corner=self.label_corner, scale=self.label_scale)
        data = encode_image(rgb, name, quality, provenance=self.provenance)
        if self.signer is not None:
            source_type = (self.provenance or Provenance()).source_type
            data = self.signer.sign(data, name, source_type)
        return data

    def describe(self) -> dict[str, Any]:
        """What clients are told (GET /v1/capabilities)."""
        return {
            "xmp": self.provenance is not None,
            "digital_source_type": self.provenance.source_type if self.provenance else None,
            "label": {"enabled": self.label is not None, "text": self.label,
                      "corner": self.label_corner, "scale": self.label_scale},
            "c2pa": {"enabled": self.signer is not None,
                     "alg": self.signer.alg if self.signer else None},
        }
