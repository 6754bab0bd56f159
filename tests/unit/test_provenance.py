"""Provenance of fused outputs, read back by tools that are not ours.

* exiftool (Debian ``libimage-exiftool-perl``) reads the XMP in JPEG, PNG and WebP;
* c2pa-python's Reader verifies a C2PA manifest signed with a throw-away chain;
* the visible label keeps its contrast on white and on black photos.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.imaging.encode import encode_image
from facefuse.imaging.output import OutputPolicy
from facefuse.imaging.provenance import (
    COMPOSITE_SYNTHETIC,
    PLATE_RGB,
    TEXT_RGB,
    Provenance,
    draw_label,
)

EXIFTOOL = shutil.which("exiftool")
needs_exiftool = pytest.mark.skipif(
    EXIFTOOL is None, reason="exiftool missing: run scripts/install-system-deps.sh")
FORMATS = ("jpeg", "png", "webp")


def exiftool(data: bytes, tmp_path: Path, suffix: str) -> dict[str, object]:
    """Every tag exiftool finds, group-prefixed (``XMP-iptcExt:DigitalSourceType``)."""
    path = tmp_path / f"probe.{suffix}"
    path.write_bytes(data)
    out = subprocess.run([EXIFTOOL or "exiftool", "-j", "-G1", "-a", str(path)],
                         capture_output=True, text=True, check=True).stdout
    tags: dict[str, object] = json.loads(out)[0]
    return tags


def _photo_with_metadata(tmp_path: Path, sample_paths: dict[str, Path]) -> Path:
    """A JPEG carrying EXIF (GPS and a camera) and an ICC profile: what must not leak."""
    im = Image.open(sample_paths["obama"])
    exif = Image.Exif()
    exif[0x010F] = "LeakyCam"  # Make
    exif[0x0131] = "secret-editor"  # Software
    path = tmp_path / "with_meta.jpg"
    im.save(path, exif=exif, icc_profile=b"\0" * 128, comment=b"private comment")
    return path


@needs_exiftool
@pytest.mark.parametrize("fmt", FORMATS)
def test_exiftool_reads_the_source_type_and_agent(fmt: str, tmp_path: Path) -> None:
    rgb = (np.random.default_rng(1).random((96, 128, 3)) * 255).astype(np.uint8)
    tags = exiftool(encode_image(rgb, fmt, provenance=Provenance()), tmp_path, fmt)
    assert tags["XMP-iptcExt:DigitalSourceType"] == COMPOSITE_SYNTHETIC
    assert str(tags["XMP-xmp:CreatorTool"]).startswith("facefuse ")
    # and the pixels are intact
    back = np.asarray(Image.open(io.BytesIO(encode_image(rgb, fmt, provenance=Provenance()))))
    assert back.shape == rgb.shape


@needs_exiftool
@pytest.mark.parametrize("fmt", FORMATS)
def test_without_provenance_there_is_no_xmp(fmt: str, tmp_path: Path) -> None:
    rgb = np.full((64, 64, 3), 90, np.uint8)
    tags = exiftool(encode_image(rgb, fmt), tmp_path, fmt)
    assert not [k for k in tags if k.startswith("XMP")]


@needs_exiftool
@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_output_has_provenance_and_no_input_metadata(
        fmt: str, sample_paths: dict[str, Path], tmp_path: Path) -> None:
    from facefuse.cli import main as cli_main

    target = _photo_with_metadata(tmp_path, sample_paths)
    assert "LeakyCam" in json.dumps(exiftool(target.read_bytes(), tmp_path, "jpg"))
    out = tmp_path / f"out.{fmt}"
    assert cli_main(["fuse", str(sample_paths["biden"]), str(target), "-o", str(out)]) == 0
    tags = exiftool(out.read_bytes(), tmp_path, fmt)
    assert tags["XMP-iptcExt:DigitalSourceType"] == COMPOSITE_SYNTHETIC
    text = json.dumps(tags)
    for leak in ("LeakyCam", "secret-editor", "private comment", "ICC"):
        assert leak not in text, leak


def _contrast(a: np.ndarray, b: np.ndarray) -> float:
    """WCAG contrast ratio of two sRGB colours (0..255)."""
    def lum(c: np.ndarray) -> float:
        v = c.astype(np.float64) / 255
        v = np.where(v <= 0.03928, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)
        return float(0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2])
    la, lb = sorted((lum(a), lum(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@pytest.mark.parametrize("background", [255, 0, 128])
@pytest.mark.parametrize("corner", ["bottom-right", "top-left"])
def test_label_is_legible_on_light_and_dark(background: int, corner: str) -> None:
    base = np.full((480, 640, 3), background, np.uint8)
    out = draw_label(base, "AI-generated", corner=corner)  # type: ignore[arg-type]
    changed = np.any(out != base, axis=2)
    ys, xs = np.nonzero(changed)
    assert len(ys) > 0
    # in the named corner, and a small part of the image
    assert (ys.mean() > 240) == corner.startswith("bottom")
    assert (xs.mean() > 320) == corner.endswith("right")
    assert changed.mean() < 0.05
    plate = out[ys.min():ys.max() + 1, xs.min():xs.max() + 1].reshape(-1, 3)
    grey = plate.mean(axis=1)
    text = plate[grey > 200].mean(axis=0)
    ground = np.median(plate[grey < grey.mean()], axis=0)
    assert _contrast(text, ground) >= 7.0, (text, ground)
    assert np.abs(text - np.asarray(TEXT_RGB)).max() < 40
    assert ground.max() < 100 and PLATE_RGB[0] < 100


def test_label_text_height_scales_with_the_image() -> None:
    small = draw_label(np.full((200, 300, 3), 255, np.uint8))
    large = draw_label(np.full((1000, 1500, 3), 255, np.uint8))
    h_small = np.any(np.any(small != 255, axis=2), axis=1).sum()
    h_large = np.any(np.any(large != 255, axis=2), axis=1).sum()
    assert h_large > 3 * h_small


def test_policy_from_settings(tmp_path: Path) -> None:
    s = Settings(home=tmp_path, label=True, label_text="KI-generiert", provenance=False)
    policy = OutputPolicy.from_settings(s)
    assert policy.provenance is None and policy.label == "KI-generiert"
    rgb = np.full((120, 160, 3), 200, np.uint8)
    assert not np.array_equal(np.asarray(Image.open(io.BytesIO(policy.encode(rgb, "png")))),
                              rgb)
    with pytest.raises(InvalidArgumentError):
        OutputPolicy.from_settings(Settings(home=tmp_path, label_corner="middle"))  # type: ignore[arg-type]  # a bad corner on purpose
    with pytest.raises(InvalidArgumentError) as exc:
        OutputPolicy.from_settings(Settings(home=tmp_path, c2pa_cert=tmp_path / "c.pem"))
    assert exc.value.code == "c2pa_unavailable"
    with pytest.raises(InvalidArgumentError):
        Settings(home=tmp_path, label_scale=2.0)


# --- C2PA -------------------------------------------------------------------------------


def make_chain(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A throw-away CA and signing certificate (EC P-256): (chain.pem, key.pem, ca pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, "facefuse tests")])

    def usage(*, sign: bool) -> x509.KeyUsage:
        return x509.KeyUsage(digital_signature=not sign, content_commitment=False,
                             key_encipherment=False, data_encipherment=False,
                             key_agreement=False, key_cert_sign=sign, crl_sign=sign,
                             encipher_only=False, decipher_only=False)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test CA")).issuer_name(name("test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(usage(sign=True), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(name("test signer"))
            .issuer_name(name("test CA")).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(usage(sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    chain, key_path = tmp_path / "chain.pem", tmp_path / "key.pem"
    chain.write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
    key_path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return chain, key_path, ca.public_bytes(pem)


@pytest.mark.parametrize("fmt", FORMATS)
def test_c2pa_manifest_signs_and_verifies(fmt: str, tmp_path: Path) -> None:
    c2pa = pytest.importorskip("c2pa")
    chain, key, _ = make_chain(tmp_path)
    policy = OutputPolicy.from_settings(Settings(home=tmp_path, c2pa_cert=chain, c2pa_key=key))
    rgb = (np.random.default_rng(2).random((96, 128, 3)) * 255).astype(np.uint8)
    signed = policy.encode(rgb, fmt)
    mime = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}[fmt]
    reader = c2pa.Reader(mime, io.BytesIO(signed))
    manifest = reader.get_active_manifest()
    actions = [a for x in manifest["assertions"] if x["label"].startswith("c2pa.actions")
               for a in x["data"]["actions"]]
    assert [a["action"] for a in actions] == ["c2pa.created", "c2pa.edited"]
    assert {a["digitalSourceType"] for a in actions} == {COMPOSITE_SYNTHETIC}
    assert actions[0]["softwareAgent"]["name"] == "facefuse"
    results = reader.get_validation_results()["activeManifest"]
    codes = {r["code"] for r in results["success"]}
    assert {"claimSignature.validated", "assertion.dataHash.match"} <= codes
    # our throw-away CA is in no trust list: that is the only failure
    assert {r["code"] for r in results["failure"]} <= {"signingCredential.untrusted"}
    # a changed byte of the image data breaks the hard binding
    unsigned = OutputPolicy().encode(rgb, fmt)
    probe = unsigned[len(unsigned) // 2:len(unsigned) // 2 + 32]
    at = signed.find(probe)
    assert at > 0
    tampered = bytearray(signed)
    tampered[at + 8] ^= 0xFF
    broken = c2pa.Reader(mime, io.BytesIO(bytes(tampered))).get_validation_results()
    failures = {r["code"] for r in broken["activeManifest"]["failure"]}
    assert failures - {"signingCredential.untrusted"}, failures
    if EXIFTOOL:
        tags = exiftool(signed, tmp_path, fmt)
        assert tags["XMP-iptcExt:DigitalSourceType"] == COMPOSITE_SYNTHETIC
