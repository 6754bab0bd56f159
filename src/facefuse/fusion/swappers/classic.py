"""The classic swapper: dense-mesh geometry, one piecewise-affine remap, tone transfer.

1. Geometry: the source mesh is brought into the target's pose and the target
   mesh moves toward its shape by the shape weight (expression regions rigidly).
2. Texture: both the source and the target image are warped onto that fused
   mesh by one dense map each over the face region (never the whole frame).
3. Tone: the source layer takes the target's low-frequency colour and shading,
   then its sharpness is matched to the target's.
4. The layer is the texture-weighted mix of the two warped images, with the
   target's own mouth interior (teeth, tongue) kept when its mouth is open.
"""

from __future__ import annotations

import numpy as np

from facefuse.faces.types import Face
from facefuse.fusion import mask as masks
from facefuse.fusion.geometry import eye_distance, fused_shape
from facefuse.fusion.swappers.base import FaceLayer
from facefuse.fusion.texture import transfer_lighting
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.color import match_sharpness
from facefuse.imaging.warp import delaunay, piecewise_affine_maps, remap_region

#: Lighting-transfer blur as a fraction of the outer-eye-corner distance.
LIGHTING_SIGMA_FRACTION = 0.12
MESH_POINTS = 468
#: Share of the target's own eye openings (lids, sclera, iris) kept in the layer:
#: the lids are expression, and the source's lid texture squeezed into the target's
#: lid shape reads as a different openness.
EYE_KEEP = 0.6


def _triangles(points: np.ndarray, region: tuple[int, int, int, int]) -> np.ndarray:
    x0, y0, x1, y1 = region
    return delaunay(points, (x0 - 1, y0 - 1, x1 + 1, y1 + 1))


class ClassicSwapper:
    """The default swapper; needs only the analysis models."""

    name = "classic"

    def render(
        self,
        source_rgb: np.ndarray,
        source_face: Face,
        target_rgb: np.ndarray,
        target_face: Face,
        options: FuseOptions,
    ) -> FaceLayer:
        assert source_face.landmarks is not None
        assert target_face.landmarks is not None
        src_lm = source_face.landmarks.astype(np.float64)
        tgt_lm = target_face.landmarks.astype(np.float64)
        dst = fused_shape(src_lm, tgt_lm, options.shape_weight)
        feather = masks.feather_px(tgt_lm)
        region = masks.union_region(
            masks.face_region(tgt_lm, target_rgb.shape, 2 * feather),
            masks.face_region(dst, target_rgb.shape, 2 * feather),
        )
        mesh_dst = dst[:MESH_POINTS, :2]
        tris = _triangles(mesh_dst, region)
        ((mx_t, my_t), (mx_s, my_s)), valid = piecewise_affine_maps(
            [tgt_lm[:MESH_POINTS, :2], src_lm[:MESH_POINTS, :2]], mesh_dst, tris, region)
        x0, y0, x1, y1 = region
        bg = target_rgb[y0:y1, x0:x1].astype(np.float32)
        outside = ~valid
        # Outside the mesh the maps are undefined: use the target's own pixels there,
        # so coarse pyramid levels of the blend never see invented content.
        target_layer = remap_region(target_rgb, mx_t, my_t).astype(np.float32)
        target_layer[outside] = bg[outside]
        mask = masks.oval_mask(dst, region, feather) * valid.astype(np.float32)
        w_tex = options.texture_weight
        if w_tex <= 0.0:
            return FaceLayer(region, target_layer, mask, dst)
        source_layer = remap_region(source_rgb, mx_s, my_s).astype(np.float32)
        source_layer[outside] = target_layer[outside]
        skin = (mask > 0.5).astype(np.float32)
        sigma = max(2.0, LIGHTING_SIGMA_FRACTION * eye_distance(dst))
        source_layer = transfer_lighting(source_layer, target_layer, skin, sigma)
        source_layer = match_sharpness(source_layer, target_layer, skin)
        alpha = np.full(mask.shape, w_tex, np.float32)
        mouth = masks.mouth_interior_mask(dst, region, feather)
        alpha *= 1.0 - mouth
        alpha *= 1.0 - EYE_KEEP * masks.eyes_mask(dst, region, feather)
        face = target_layer + alpha[..., None] * (source_layer - target_layer)
        return FaceLayer(region, face, mask, dst)


def layer_bounds(layer: FaceLayer) -> tuple[int, int, int, int]:
    """Tight bounding box (in image pixels) of the non-zero part of a layer's mask."""
    ys, xs = np.nonzero(layer.mask > 0)
    x0, y0 = layer.region[:2]
    if len(xs) == 0:
        return x0, y0, x0, y0
    return x0 + int(xs.min()), y0 + int(ys.min()), x0 + int(xs.max()) + 1, y0 + int(ys.max()) + 1


