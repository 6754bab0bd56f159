"""Face verification: are two analysed faces the same person?

The one rule the library (:func:`facefuse.verify`) and the HTTP API
(``POST /v1/verify``) answer with: dlib's, the Euclidean distance of the raw
128-D descriptors below a threshold (0.6 by default,
``Settings.same_person_distance``), plus the cosine similarity of the unit
embeddings for people to read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from facefuse.errors import NoFaceError
from facefuse.faces.recognizer import cosine_similarity, distance
from facefuse.faces.types import Face

__all__ = ["Verification", "largest_face", "verify_faces"]


@dataclass(frozen=True)
class Verification:
    """The comparison of face ``a`` with face ``b``.

    Attributes:
        similarity: cosine similarity of the unit embeddings, -1..1.
        distance: Euclidean distance of the raw dlib descriptors (0 = identical).
        threshold: below this distance the faces are the same person.
        a, b: the faces compared (each photo's largest).
    """

    similarity: float
    distance: float
    threshold: float
    a: Face
    b: Face

    @property
    def same_person(self) -> bool:
        """``distance < threshold``."""
        return self.distance < self.threshold

    def to_dict(self) -> dict[str, object]:
        """``{"similarity", "distance", "threshold", "same_person", "faces": {"a", "b"}}``
        (boxes in whole hundredths of a pixel)."""
        return {
            "similarity": round(self.similarity, 6),
            "distance": round(self.distance, 6),
            "threshold": self.threshold,
            "same_person": self.same_person,
            "faces": {"a": [round(float(v), 2) for v in self.a.bbox],
                      "b": [round(float(v), 2) for v in self.b.bbox]},
        }


def largest_face(faces: Sequence[Face], name: str) -> Face:
    """The first (largest) of an analysis's faces; ``NoFaceError`` with code
    ``<name>_no_face`` when there is none."""
    if not faces:
        raise NoFaceError(f"no face found in image {name!r}", code=f"{name}_no_face")
    return faces[0]


def verify_faces(a: Face, b: Face, threshold: float = 0.6) -> Verification:
    """Compare two embedded faces (``embedding`` and ``embedding_raw`` set)."""
    if a.embedding is None or b.embedding is None or a.embedding_raw is None \
            or b.embedding_raw is None:
        raise ValueError("verify_faces needs embedded faces")
    return Verification(float(cosine_similarity(a.embedding, b.embedding)),
                        float(distance(a.embedding_raw, b.embedding_raw)), threshold, a, b)
