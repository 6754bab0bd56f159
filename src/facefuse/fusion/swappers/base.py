"""The swapper interface: how a face layer for one target face is produced.

A swapper renders the new face over a region of the target; the engine then
blends it in with the chosen blend mode and pastes back only that region.
What the rest of the fusion needs to know of a swapper is declared on it here
(:class:`Swapper`'s properties), never read off its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from facefuse.faces.types import Face
from facefuse.fusion.carry import Carried
from facefuse.fusion.types import FuseOptions


@dataclass
class FaceLayer:
    """A rendered face over ``region`` = (x0, y0, x1, y1) of the target image.

    ``face`` (h, w, 3) float32 RGB 0..255; ``mask`` (h, w) float32 in [0, 1],
    where the layer replaces the target; ``landmarks`` (N, 3) the mesh of the
    rendered face in target-image pixels; ``keep`` (h, w) float32 in [0, 1] or
    None: where the target's own pixels go back on top after blending (what
    covers the target's face), so no blend band reaches into them.
    ``outside_source``: the share (0..1) of the face's pixels whose colour comes
    from beyond the source's face outline (None when not measured).
    A layer is the engine's once returned: a photo's blend works in its float32
    ``face`` (no copy beside it), so a swapper returns a face array of its own,
    never one it keeps or shares.
    """

    region: tuple[int, int, int, int]
    face: np.ndarray
    mask: np.ndarray
    landmarks: np.ndarray
    keep: np.ndarray | None = None
    outside_source: float | None = None


class Swapper(Protocol):
    """Renders the source identity onto one target face."""

    name: str

    @property
    def needs_source_embedding(self) -> bool:
        """Whether :meth:`render` reads the source face's identity embedding
        (``Face.embedding``): the source photos are then analysed with the
        recogniser."""
        ...

    @property
    def fork_safe(self) -> bool:
        """Whether :meth:`render` may run in a child forked from this process (no
        ONNX Runtime session, GPU context or thread pool of the parent's in it)."""
        ...

    def render(
        self,
        source_rgb: np.ndarray,
        source_face: Face,
        target_rgb: np.ndarray,
        target_face: Face,
        options: FuseOptions,
        carried: Carried | None = None,
    ) -> FaceLayer:
        """Return the face layer; ``options`` carries degree/shape/texture weights;
        ``carried``: what :meth:`carry` found on this face in an earlier frame of a
        clip (None: everything is found on this frame)."""
        ...

    def carry(self, target_rgb: np.ndarray, target_face: Face, options: FuseOptions,
              source_face: Face | None = None) -> Carried | None:
        """What of ``target_face`` (with ``source_face`` fused into it, when given) the
        next frames of a clip may reuse (:mod:`facefuse.fusion.carry`), or None when
        the swapper reuses nothing."""
        ...


@dataclass(frozen=True)
class SwapperInfo:
    """What a caller may know of a swapper before choosing it
    (:meth:`facefuse.fusion.engine.FaceFuser.describe_swappers`: ``GET
    /v1/capabilities``, the result cache's key).

    Attributes:
        name: what ``FuseOptions.swapper`` calls it.
        kind: ``classic``, ``onnx`` (a manifest ``task: "swap"`` model) or ``custom``
            (one handed to the fuser by its caller).
        needs_source_embedding: :attr:`Swapper.needs_source_embedding`.
        models: manifest name → sha256 of each model its render runs beyond the
            analysis models (a swap model and its recogniser): another file there
            renders another face.
    """

    name: str
    kind: str
    needs_source_embedding: bool
    models: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """``{"name", "kind", "needs_source_embedding"}``."""
        return {"name": self.name, "kind": self.kind,
                "needs_source_embedding": self.needs_source_embedding}
