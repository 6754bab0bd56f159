"""The target's kept occluders (a layer's ``keep``): drawn crisp at full size and put
back over the blend, each worked out over the occluder's bounding box only, with
exactly the pixels the whole region would give."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.fusion.engine import blend_layer
from facefuse.fusion.swappers.base import FaceLayer
from facefuse.fusion.swappers.classic import occlusion as occ
from facefuse.fusion.swappers.classic.swapper import _crisp
from facefuse.imaging.blend import alpha_blend
from facefuse.imaging.pixels import OpenCVPixels

SHAPE = (97, 83)


def _blobs(where: str) -> np.ndarray:
    m = np.zeros(SHAPE, bool)
    if where == "inside":
        m[40:47, 30:52] = True
        m[60, 10] = True
    elif where == "edges":
        m[0:3, 20:30] = True  # top edge
        m[50:60, 80:83] = True  # right edge
        m[94:97, 0:5] = True  # bottom-left corner
    elif where == "all":
        m[:] = True
    return m


@pytest.mark.parametrize("where", ["inside", "edges", "all", "none"])
def test_crisp_is_the_whole_masks_softening(where: str) -> None:
    kept = _blobs(where)
    expected = occ.soften(kept.astype(np.float32), 1.0, 0.5)
    np.testing.assert_array_equal(_crisp(kept), expected)


def test_crisp_is_exact_for_speckled_masks_anywhere() -> None:
    """Ragged occluders (hair, a beard's edge) at every column offset and size: the
    same bits as the whole mask's softening (a box cut at other columns was 1 ulp
    off in half of these)."""
    rng = np.random.default_rng(0)
    for _ in range(120):
        h, w = (int(v) for v in rng.integers(50, 700, 2))
        kept = np.zeros((h, w), bool)
        for _ in range(int(rng.integers(1, 4))):
            y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
            blob = rng.random((min(int(rng.integers(1, 80)), h - y),
                               min(int(rng.integers(1, 80)), w - x))) > 0.3
            kept[y:y + blob.shape[0], x:x + blob.shape[1]] |= blob
        expected = occ.soften(kept.astype(np.float32), 1.0, 0.5)
        np.testing.assert_array_equal(_crisp(kept), expected)


@pytest.mark.parametrize("consume", [False, True])
@pytest.mark.parametrize("where", ["inside", "edges", "none"])
def test_blend_layer_puts_back_the_kept_pixels_as_over_the_whole_region(
        where: str, consume: bool) -> None:
    """Also when the blend works in the layer's own face (``consume``): the same
    pixels, and the face is left alone unless given up."""
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (140, 120, 3), dtype=np.uint8)
    region = (20, 30, 20 + SHAPE[1], 30 + SHAPE[0])
    face = rng.uniform(-10, 265, (*SHAPE, 3)).astype(np.float32)
    mask = np.clip(rng.uniform(-0.5, 1.5, SHAPE), 0, 1).astype(np.float32)
    keep = _crisp(_blobs(where))
    layer = FaceLayer(region, face.copy(), mask, np.zeros((478, 3)), keep)
    got = image.copy()
    blend_layer(got, layer, "multiband", consume=consume)
    assert np.array_equal(layer.face, face) is not consume
    x0, y0, x1, y1 = region
    bg = image[y0:y1, x0:x1]
    out = OpenCVPixels().multiband(np.clip(face, 0, 255), bg, mask)
    whole = alpha_blend(bg.astype(np.float32), out.astype(np.float32), keep)
    expected = image.copy()
    expected[y0:y1, x0:x1] = np.clip(np.rint(whole), 0, 255)
    np.testing.assert_array_equal(got, expected)
