"""Template records: what a stored template is, and how it is read back safely.

A record is an *uncompressed* numpy ``.npz`` (a zip of ``.npy`` arrays, no pickle):
``head`` (UTF-8 JSON: id, name, metadata, sizes, model versions, per-face scalars),
``image`` (the uploaded bytes) and ``f<i>_<array>`` per face. Its summary (what the
listing shows) carries the record's SHA-256.

Reading a record trusts nothing in it (a disk, a volume or a Redis may hand back
anything); :func:`unpack` checks, in order, before any array is allocated:

1. its size: at most the caller's ``max_bytes`` (read no more than that);
2. its SHA-256 against the summary's, when the summary has one;
3. every zip member is *stored* (no compression): nothing decompresses, so a
   record never grows in memory beyond its own size (no deflate bomb);
4. every array's header: a plain numeric or bytes dtype (never ``object``) whose
   declared shape fits in the bytes the member really holds;
5. the head's fields, by type; the name and metadata by :func:`check_labels`.

A failed check raises :class:`DamagedRecordError` (the store quarantines the record).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from facefuse.errors import InvalidArgumentError
from facefuse.faces.types import Face

__all__ = [
    "MAX_METADATA",
    "MAX_METADATA_KEY",
    "MAX_METADATA_VALUE",
    "MAX_NAME",
    "DamagedRecordError",
    "Template",
    "check_labels",
    "record_sha256",
    "unpack",
]

#: Longest template name, most metadata entries, longest key and value (characters).
MAX_NAME = 100
MAX_METADATA = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 256

FACE_ARRAYS = ("bbox", "keypoints", "landmarks", "landmarks5", "chip_transform", "embedding",
               "embedding_raw")
FACE_SCALARS = ("score", "mesh_score", "age", "gender", "gender_score")


class DamagedRecordError(ValueError):
    """A stored record that fails a check of the module docstring (the reason is the
    message: for logs, never shown to clients)."""


def _text_problem(value: object, what: str, limit: int) -> str | None:
    if not isinstance(value, str):
        return f"{what} must be a string"
    if len(value) > limit:
        return f"{what} is longer than {limit} characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} is not valid Unicode text (a lone surrogate)"
    if any((ord(c) < 0x20 and c not in "\t\n") or ord(c) == 0x7F for c in value):
        return f"{what} holds a control character"
    return None


def check_labels(name: object, metadata: object) -> None:
    """Refuse a name or metadata that could not be stored and listed back as JSON.

    Raises:
        InvalidArgumentError: code ``invalid_template_metadata``: not a string /
            a ``{string: string}`` object, too long, too many pairs, a lone surrogate
            (not UTF-8 encodable) or a control character.
    """
    problem = _text_problem(name, "name", MAX_NAME)
    if problem is None and not isinstance(metadata, dict):
        problem = "metadata must be a JSON object of strings"
    elif problem is None and isinstance(metadata, dict) and len(metadata) > MAX_METADATA:
        problem = f"metadata holds more than {MAX_METADATA} pairs"
    if problem is None and isinstance(metadata, dict):
        for k, v in metadata.items():
            problem = (_text_problem(k, "a metadata key", MAX_METADATA_KEY)
                       or _text_problem(v, f"metadata value {str(k)[:32]!r}",
                                        MAX_METADATA_VALUE))
            if problem:
                break
    if problem:
        raise InvalidArgumentError(problem, code="invalid_template_metadata")


@dataclass(frozen=True)
class Template:
    """A stored template.

    Attributes:
        id: content address (see :func:`facefuse.serving.templates.template_id`).
        name, metadata: labels for people (checked by :func:`check_labels`).
        image: the uploaded image bytes, as sent.
        faces: its analysed faces, largest first, with embeddings.
        width, height: the decoded image's size in pixels.
        model_versions: the models that analysed it (name → sha256 prefix).
        created: registration time, Unix seconds.
    """

    id: str
    name: str
    image: bytes
    faces: tuple[Face, ...]
    width: int
    height: int
    model_versions: dict[str, str]
    metadata: dict[str, str] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        check_labels(self.name, self.metadata)

    def summary(self, sha256: str | None = None) -> dict[str, Any]:
        """What ``GET /v1/templates`` lists (no image, no face details); with the
        record's ``sha256`` when given (stores keep it to verify the record)."""
        out: dict[str, Any] = {
            "id": self.id, "name": self.name, "metadata": self.metadata,
            "created": round(self.created, 3), "width": self.width, "height": self.height,
            "faces": len(self.faces), "bytes": self.nbytes}
        if sha256 is not None:
            out["sha256"] = sha256
        return out

    @property
    def nbytes(self) -> int:
        """Image plus face arrays, bytes (what the store bound counts)."""
        return len(self.image) + sum(
            int(a.nbytes) for f in self.faces for a in (getattr(f, n) for n in FACE_ARRAYS)
            if a is not None)

    def pack(self) -> bytes:
        """The record (see the module docstring)."""
        head: dict[str, Any] = {
            "id": self.id, "name": self.name, "metadata": self.metadata,
            "created": self.created, "width": self.width, "height": self.height,
            "model_versions": self.model_versions,
            "faces": [{n: getattr(f, n) for n in FACE_SCALARS} for f in self.faces]}
        arrays: dict[str, np.ndarray] = {
            "head": np.frombuffer(json.dumps(head).encode(), np.uint8),
            "image": np.frombuffer(self.image, np.uint8)}
        for i, f in enumerate(self.faces):
            for n in FACE_ARRAYS:
                a = getattr(f, n)
                if a is not None:
                    arrays[f"f{i}_{n}"] = a
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]  # uncompressed: members stored
        return buf.getvalue()


def record_sha256(record: bytes) -> str:
    """Hex SHA-256 of a record, as summaries carry it."""
    return hashlib.sha256(record).hexdigest()


def _checked_members(z: zipfile.ZipFile, size: int) -> None:
    total = 0
    for info in z.infolist():
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise DamagedRecordError(f"member {info.filename[:40]!r} is compressed")
        total += info.file_size
        with z.open(info) as fh:
            version = npy_format.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = npy_format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _, dtype = npy_format.read_array_header_2_0(fh)
            else:
                raise DamagedRecordError(f"member {info.filename[:40]!r}: npy version {version}")
            header = fh.tell()
        if dtype.hasobject or dtype.kind not in "biuf":
            raise DamagedRecordError(f"member {info.filename[:40]!r} has dtype {dtype}")
        if math.prod(shape) * dtype.itemsize > info.file_size - header:
            raise DamagedRecordError(
                f"member {info.filename[:40]!r} declares more data than it holds")
    if total > size:
        raise DamagedRecordError("members declare more bytes than the record holds")


def _head(raw: bytes) -> dict[str, Any]:
    head = json.loads(raw)
    ok = (isinstance(head, dict) and isinstance(head.get("id"), str)
          and isinstance(head.get("faces"), list)
          and all(isinstance(head.get(k), int) and head[k] > 0 for k in ("width", "height"))
          and isinstance(head.get("created"), int | float)
          and isinstance(head.get("model_versions"), dict)
          and all(isinstance(s, dict) and set(s) <= set(FACE_SCALARS) for s in head["faces"]))
    if not ok:
        raise DamagedRecordError("the head's fields are missing or mistyped")
    out: dict[str, Any] = head
    return out


def unpack(data: bytes, *, max_bytes: int, sha256: str | None = None) -> Template:
    """The template in ``data``, every check of the module docstring passed.

    Raises:
        DamagedRecordError: a check failed (the message says which).
    """
    if len(data) > max_bytes:
        raise DamagedRecordError(f"{len(data)} bytes, more than the {max_bytes} a record may hold")
    if sha256 is not None and record_sha256(data) != sha256:
        raise DamagedRecordError("its SHA-256 differs from the one stored at registration")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            _checked_members(z, len(data))
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            head = _head(npz["head"].tobytes())
            faces = []
            for i, scalars in enumerate(head["faces"]):
                arrays: dict[str, Any] = {n: np.array(npz[f"f{i}_{n}"]) for n in FACE_ARRAYS
                                          if f"f{i}_{n}" in npz.files}
                faces.append(Face(**arrays, **scalars))
            image = npz["image"].tobytes()
        name: Any = head.get("name")
        metadata: Any = head.get("metadata")
        return Template(id=head["id"], name=name, image=image,
                        faces=tuple(faces), width=head["width"], height=head["height"],
                        model_versions=head["model_versions"], metadata=metadata,
                        created=float(head["created"]))
    except DamagedRecordError:
        raise
    except (InvalidArgumentError, ValueError, KeyError, TypeError, EOFError, OSError,
            zipfile.BadZipFile, RuntimeError) as exc:
        raise DamagedRecordError(f"unreadable: {type(exc).__name__}: {str(exc)[:120]}") from None
