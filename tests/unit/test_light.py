"""Spherical-harmonic lighting from mesh normals: normals, fit, gains, and the
direction of a known gradient on a real face."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.swappers.classic import light
from facefuse.fusion.swappers.classic.occlusion import skin_vertices
from facefuse.imaging.warp import delaunay
from facefuse.toolchain.synthetic import relight_gradient


def hemisphere(n: int = 25, radius: float = 100.0) -> tuple[np.ndarray, np.ndarray]:
    """Mesh points (N, 3) of a sphere's front half in the mesh's image frame (z away
    from the camera) and their true normals in the SH frame."""
    u = np.linspace(-0.9, 0.9, n)
    x, y = np.meshgrid(u, u)
    keep = x**2 + y**2 < 0.85
    x, y = x[keep], y[keep]
    z = np.sqrt(1 - x**2 - y**2)
    points = np.c_[200 + radius * x, 200 + radius * y, -radius * z]  # nearer = smaller z
    normals = np.c_[x, -y, z]  # x right, y up, z toward the viewer
    return points, normals


def test_vertex_normals_of_a_sphere_point_outward() -> None:
    points, truth = hemisphere()
    tris = delaunay(points[:, :2])
    n = light.vertex_normals(points, tris)
    cos = np.sum(n * truth, axis=1)
    assert np.median(cos) > 0.995
    assert np.percentile(cos, 5) > 0.95  # the rim has one-sided neighbourhoods


def test_fit_recovers_a_known_directional_light() -> None:
    _, normals = hemisphere()
    coeffs = np.zeros((9, 3))
    coeffs[0] = (150.0, 120.0, 100.0)
    coeffs[1] = (40.0, 32.0, 27.0)  # light from the viewer's right
    colours = light.sh_basis(normals) @ coeffs
    fit = light.fit_lighting(colours, normals)
    assert np.allclose(light.shading(fit, normals), colours, rtol=0.05, atol=3.0)
    assert fit[1, 0] > 30.0 and abs(fit[2, 0]) < 5.0
    flat = coeffs.copy()
    flat[1:] = 0.0
    assert light.directional_error(fit) > 0.2 > light.directional_error(flat)


def test_same_lighting_and_geometry_gives_unit_gains() -> None:
    _, normals = hemisphere()
    coeffs = np.zeros((9, 3))
    coeffs[0], coeffs[3] = 120.0, 30.0
    g = light.relight_gains(coeffs, normals, coeffs, normals)
    assert np.allclose(g, 1.0)
    brighter = coeffs * 1.5
    assert np.allclose(light.relight_gains(coeffs, normals, brighter, normals), 1.5)


@pytest.mark.parametrize("name", ["obama", "biden", "astronaut"])
def test_a_gradient_lit_face_is_estimated_lit_from_that_side(
        analyser: FaceAnalyser, sample_images: dict[str, np.ndarray], name: str) -> None:
    img = sample_images[name]
    mesh = analyser.analyse(img, embed=False)[0].landmarks
    assert mesh is not None
    lm = mesh.astype(np.float64)[:468]
    tris = delaunay(lm[:, :2])
    normals = light.vertex_normals(lm, tris)
    base = light.face_lighting(img, lm, normals)
    right = light.face_lighting(relight_gradient(img, lm, 0.35), lm, normals)
    left = light.face_lighting(relight_gradient(img, lm, -0.35), lm, normals)
    assert base is not None and right is not None and left is not None
    x = 1  # the first-band x coefficient (light from the viewer's right when positive)
    assert (right[x] - base[x] > 5.0).all(), (right[x], base[x])
    assert (left[x] - base[x] < -5.0).all(), (left[x], base[x])
    assert len(skin_vertices(lm)) >= 2 * light.MIN_FIT_VERTICES


def _chroma(rgb: np.ndarray) -> np.ndarray:
    """The rgb's offset from its luma over its luma (its hue and saturation)."""
    luma = float(rgb @ np.array([0.299, 0.587, 0.114], np.float32))
    out: np.ndarray = (rgb - luma) / luma
    return out


def test_dark_pixels_keep_their_own_hue_when_the_skin_takes_the_targets_tone() -> None:
    """Brows, lashes, stubble: the per-channel gains that give a dark source's skin a
    fair target's tone turned its brown brows blue-grey. Dark pixels take the relit
    luma with their own hue (at a saturation scaled as the skin's, half-way); the skin
    keeps the gains."""
    before = np.full((40, 40, 3), (200.0, 150.0, 120.0), np.float32)
    before[10:20, 5:35] = (40.0, 25.0, 20.0)  # a brown brow
    luma = np.array([0.299, 0.587, 0.114], np.float32)
    for gains in (np.array([1.1, 1.4, 1.6], np.float32),   # a paler, cooler target
                  np.array([1.05, 1.0, 0.95], np.float32)):  # a warmer one
        relit = before * gains
        kept = relit.copy()
        light.keep_dark_hue(kept, before, np.ones((40, 40), np.float32))
        brow_b, brow_r, brow_k = before[15, 20], relit[15, 20], kept[15, 20]
        own, got = _chroma(brow_b), _chroma(brow_k)
        # The brow's own hue: the same direction of its offset from grey ...
        assert float(own @ got) / (np.linalg.norm(own) * np.linalg.norm(got)) > 0.999
        # ... at the skin's change of saturation, half-way (never raised).
        skin_b, skin_r = before[30, 20], relit[30, 20]
        ratio = float(np.ptp(skin_r) / skin_r.mean()) / float(np.ptp(skin_b) / skin_b.mean())
        expect = min(1.0, max(light.SATURATION_FLOOR, ratio ** 0.5))
        assert np.linalg.norm(got) / np.linalg.norm(own) == pytest.approx(expect, rel=0.02)
        assert brow_k @ luma == pytest.approx(brow_r @ luma, rel=0.03)
        assert brow_k[2] < brow_k[0]  # never blue-grey
        assert np.array_equal(kept[30:, :], relit[30:, :])  # the skin is as relit
