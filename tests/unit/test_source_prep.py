"""The per-source memo of the renderer's source-side work: a render that uses it is
the render that does not, and it never hands one source's work to another."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.swappers.classic import ClassicSwapper, source_prep
from facefuse.fusion.swappers.classic import swapper as classic
from facefuse.fusion.swappers.classic import symmetry as sym
from facefuse.fusion.swappers.classic.source_prep import SourceCache, quantised_scale
from facefuse.fusion.types import FuseOptions


@pytest.fixture(scope="module")
def faces(analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]) -> dict[str, Any]:
    return {n: analyser.analyse(img, purpose="largest")[0] for n, img in sample_images.items()}


@pytest.mark.parametrize(("source", "target", "options"), [
    ("biden", "obama", FuseOptions()),
    ("obama3", "obama", FuseOptions(glasses=True, facial_hair="both")),
    ("obama2", "biden", FuseOptions(degree=0.6, evaluate=False)),
])
def test_a_cached_render_is_the_uncached_render(
        sample_images: dict[str, np.ndarray], faces: dict[str, Any], source: str,
        target: str, options: FuseOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    src, tgt = sample_images[source], sample_images[target]
    calls: list[int] = []
    real = sym.tone_colours

    def counted(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(sym, "tone_colours", counted)
    plain = ClassicSwapper(cache_sources=False).render(src, faces[source], tgt, faces[target],
                                                       options)
    per_render = len(calls)
    # These turned sources take the symmetric fill onto these targets: its tone path runs.
    assert per_render == 1
    cached = ClassicSwapper()
    first = cached.render(src, faces[source], tgt, faces[target], options)
    assert len(calls) == 2 * per_render
    second = cached.render(src, faces[source], tgt, faces[target], options)
    assert cached.sources is not None
    assert (cached.sources.hits, cached.sources.misses) == (1, 1)
    # The second render read the source's work from the memo.
    assert len(calls) == 2 * per_render
    for layer in (first, second):
        assert layer.region == plain.region
        assert layer.outside_source == plain.outside_source
        assert np.array_equal(layer.face, plain.face) and np.array_equal(layer.mask, plain.mask)
        assert np.array_equal(layer.landmarks, plain.landmarks)
        assert (layer.keep is None) == (plain.keep is None)
        if plain.keep is not None:
            assert layer.keep is not None and np.array_equal(layer.keep, plain.keep)


def test_the_memo_is_found_by_the_image_object_not_its_pixels() -> None:
    cache = SourceCache()
    image = np.zeros((64, 48, 3), np.uint8)
    lm = np.ones((478, 3), np.float32)
    entry = cache.entry(image, lm, 0.5)
    assert entry.get("x", lambda: np.arange(3)).tolist() == [0, 1, 2]
    assert cache.entry(image, lm, 0.5) is entry and cache.hits == 1
    # The same pixels in another array, other landmarks, another parameter: not found.
    twin = image.copy()
    for other in (cache.entry(twin, lm, 0.5), cache.entry(image, lm + 1, 0.5),
                  cache.entry(image, lm, 0.25)):
        assert other is not entry and other.get("x", lambda: "fresh") == "fresh"
    # The image edited in place: not found either.
    image[8, 8] = 255
    assert cache.entry(image, lm, 0.5) is not entry


def test_an_entry_dies_with_its_image_and_the_cache_is_bounded() -> None:
    cache = SourceCache(max_entries=2, max_items=2)
    lm = np.zeros((478, 3))
    images = [np.full((16, 16, 3), i, np.uint8) for i in range(3)]
    entries = [cache.entry(im, lm) for im in images]
    assert len(cache) == 2  # the least recently used source was dropped
    assert cache.entry(images[0], lm) is not entries[0]
    del images[1:]
    assert len(cache) == 1
    e = cache.entry(images[0], lm)
    for name in "abc":
        e.get(name, lambda n=name: n)  # type: ignore[misc]
    assert e.get("a", lambda: "recomputed") == "recomputed"  # only two items kept


def test_what_the_memo_returns_is_read_only() -> None:
    entry = SourceCache().entry(np.zeros((8, 8, 3), np.uint8), np.zeros((478, 3)))
    a, (b, c) = entry.get("arrays", lambda: (np.zeros(3), (np.ones(2), 7)))
    with pytest.raises(ValueError, match="read-only"):
        a += 1
    with pytest.raises(ValueError, match="read-only"):
        b[0] = 2
    assert c == 7
    assert source_prep.UNCACHED.get("x", lambda: [1]) == [1]


def test_threads_asking_at_once_share_one_result() -> None:
    entry = SourceCache().entry(np.zeros((8, 8, 3), np.uint8), np.zeros((478, 3)))
    start = threading.Barrier(4)
    got: list[object] = []

    def ask() -> None:
        start.wait()
        got.append(entry.get("x", lambda: object()))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g is got[0] for g in got)


def test_the_scale_grid() -> None:
    assert quantised_scale(1.0) == 1.0 and quantised_scale(0.5) == 0.5
    for s in np.linspace(0.05, 1.0, 97):
        q = quantised_scale(float(s))
        assert abs(np.log2(q / s)) <= 0.5 / source_prep.SCALE_STEPS_PER_OCTAVE + 1e-12
    # Faces a pixel apart share a step; the steps are about 2 % apart.
    assert quantised_scale(0.700) == quantised_scale(0.702)
    assert 1.02 < quantised_scale(0.7) / quantised_scale(0.68) < 1.05


def test_a_rendered_sources_entry_dies_with_the_source_image(
        sample_images: dict[str, np.ndarray], faces: dict[str, Any]) -> None:
    """What the renderer keeps (its crop of a full-width face included) holds no view
    of the source: once a request drops its decoded source, the memo drops it too."""
    import gc

    swapper = ClassicSwapper()
    assert swapper.sources is not None
    src = sample_images["obama"].copy()  # a request's own decoded source
    swapper.render(src, faces["obama"], sample_images["biden"], faces["biden"], FuseOptions())
    assert len(swapper.sources) == 1
    del src
    gc.collect()
    assert len(swapper.sources) == 0 and not swapper.sources._entries


def test_the_source_side_on_its_own_thread_renders_what_one_thread_does(
        sample_images: dict[str, np.ndarray], faces: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The source's half of a render on the side pool, the target's in the caller:
    the same layer, to the bit, as both in one thread; and four renders at once on
    one swapper with two side threads (the others run their source side inline)
    each give their own pair's layer."""
    pairs = [("biden", "obama"), ("obama", "astronaut"), ("astronaut", "obama2"),
             ("obama2", "biden")]
    inline = ClassicSwapper(cache_sources=False, side_threads=0)
    expected = [inline.render(sample_images[s], faces[s], sample_images[t], faces[t],
                              FuseOptions()) for s, t in pairs]
    shared = ClassicSwapper(cache_sources=False, side_threads=2)
    got: dict[int, Any] = {}
    ran_on: list[str] = []
    real = classic._source_side

    def recorded(*a: Any) -> Any:
        ran_on.append(threading.current_thread().name)
        return real(*a)

    monkeypatch.setattr(classic, "_source_side", recorded)

    def render(i: int) -> None:
        s, t = pairs[i]
        got[i] = shared.render(sample_images[s], faces[s], sample_images[t], faces[t],
                               FuseOptions())

    threads = [threading.Thread(target=render, args=(i,)) for i in range(len(pairs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i, want in enumerate(expected):
        assert np.array_equal(got[i].face, want.face)
        assert np.array_equal(got[i].mask, want.mask)
    # Some source sides ran on the side threads (the others inline), and every side
    # thread is free again once the pool has let its threads go.
    assert len(ran_on) == len(pairs)
    assert any(name.startswith("facefuse-source") for name in ran_on)
    shared.close()
    assert shared._side_busy == 0


def test_a_failing_source_side_fails_the_render(
        sample_images: dict[str, np.ndarray], faces: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An error on the side thread reaches the caller (not a hang, not a half layer)."""
    def broken(*_: Any) -> Any:
        raise RuntimeError("source side failed")

    monkeypatch.setattr(classic, "_source_crop", broken)
    for threads in (0, 2):
        with pytest.raises(RuntimeError, match="source side failed"):
            ClassicSwapper(cache_sources=False, side_threads=threads).render(
                sample_images["biden"], faces["biden"], sample_images["obama"],
                faces["obama"], FuseOptions())


def test_a_forked_child_renders_with_its_own_threads(
        sample_images: dict[str, np.ndarray], faces: dict[str, Any]) -> None:
    """A swapper whose side threads ran before a fork renders in the child (no pool
    or lock inherited from the parent) and gives the parent's layer."""
    import os
    import select
    import signal

    swapper = ClassicSwapper(side_threads=2)
    src, tgt = sample_images["biden"], sample_images["obama"]
    want = swapper.render(src, faces["biden"], tgt, faces["obama"], FuseOptions())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: render, report, leave at once
        code = 1
        try:
            got = swapper.render(src, faces["biden"], tgt, faces["obama"], FuseOptions())
            code = 0 if np.array_equal(got.face, want.face) else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    try:
        # A child stuck on an inherited lock would never answer: not waited for.
        ready, _, _ = select.select([read], [], [], 120.0)
        answer = os.read(read, 1) if ready else b"hung"
    finally:
        os.close(read)
        if answer == b"hung":
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    swapper.close()
    assert answer == b"\x00", answer
