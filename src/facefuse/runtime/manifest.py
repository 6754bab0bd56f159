"""The model manifest: every model declared as data.

``<models_dir>/manifest.json`` holds, per model: name, task, file, sha256,
size, opset, input/output names and shapes, preprocessing, source package and
source-file sha256, licence and precision.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from facefuse.errors import ModelCorruptError, ModelMissingError
from facefuse.runtime.files import atomic_write_text, sha256_file

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1
FIX_HINT = "run `facefuse models build` to (re)build the model zoo"


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, shape (str for symbolic dims), dtype."""

    name: str
    shape: list[int | str]
    dtype: str = "float32"


@dataclass(frozen=True)
class Preprocessing:
    """How pixels become the model input: ``(pixel - mean) / std`` per channel.

    ``size`` is (width, height) in pixels; ``color`` RGB or BGR; ``layout`` NCHW/NHWC.
    """

    size: tuple[int, int]
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    color: str = "RGB"
    layout: str = "NCHW"


@dataclass(frozen=True)
class Source:
    """Where the weights came from."""

    package: str  # "name==version"
    file: str  # path inside the distribution
    sha256: str  # of that file
    licence: str


@dataclass(frozen=True)
class ModelSpec:
    """A manifest entry."""

    name: str
    task: str
    file: str
    sha256: str
    size: int
    opset: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    preprocessing: Preprocessing
    source: Source
    licence: str
    precision: str = "fp32"
    #: For derived variants (int8/fp16): the fp32 model they were made from.
    base: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelSpec:
        pre = d["preprocessing"]
        return cls(
            name=d["name"],
            task=d["task"],
            file=d["file"],
            sha256=d["sha256"],
            size=int(d["size"]),
            opset=int(d["opset"]),
            inputs=[TensorSpec(**t) for t in d["inputs"]],
            outputs=[TensorSpec(**t) for t in d["outputs"]],
            preprocessing=Preprocessing(
                size=(int(pre["size"][0]), int(pre["size"][1])),
                mean=_triple(pre["mean"]),
                std=_triple(pre["std"]),
                color=pre["color"],
                layout=pre["layout"],
            ),
            source=Source(**d["source"]),
            licence=d["licence"],
            precision=d.get("precision", "fp32"),
            base=d.get("base"),
            extra=dict(d.get("extra", {})),
        )


def _triple(v: Any) -> tuple[float, float, float]:
    return float(v[0]), float(v[1]), float(v[2])


@dataclass
class Manifest:
    """All model specs of one model directory, keyed by name."""

    models: dict[str, ModelSpec] = field(default_factory=dict)

    @classmethod
    def load(cls, models_dir: Path) -> Manifest:
        """Read ``manifest.json``; a missing or unreadable file is a typed error."""
        path = models_dir / MANIFEST_NAME
        if not path.is_file():
            raise ModelMissingError(f"no model manifest at {path}: {FIX_HINT}")
        try:
            raw = json.loads(path.read_text())
            models = {name: ModelSpec.from_json(d) for name, d in raw["models"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelCorruptError(
                f"unreadable model manifest {path} ({exc}): {FIX_HINT}") from exc
        return cls(models)

    def save(self, models_dir: Path) -> Path:
        """Write atomically (temp file + rename) so readers never see half a file."""
        models_dir.mkdir(parents=True, exist_ok=True)
        body = {
            "schema_version": SCHEMA_VERSION,
            "models": {name: spec.to_json() for name, spec in sorted(self.models.items())},
        }
        path = models_dir / MANIFEST_NAME
        atomic_write_text(path, json.dumps(body, indent=2) + "\n")
        return path

    def get(self, name: str) -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            raise ModelMissingError(
                f"model {name!r} is not in the manifest (have: {', '.join(sorted(self.models))}): "
                f"{FIX_HINT}"
            ) from None

    def for_task(self, task: str) -> list[ModelSpec]:
        return [m for m in self.models.values() if m.task == task]


def verify_file(models_dir: Path, spec: ModelSpec) -> Path:
    """Check that a model file exists and matches its sha256; return its path."""
    path = models_dir / spec.file
    if not path.is_file():
        raise ModelMissingError(f"model file {path} for {spec.name!r} is missing: {FIX_HINT}")
    digest = sha256_file(path)
    if digest != spec.sha256:
        raise ModelCorruptError(
            f"model file {path} for {spec.name!r} is corrupt (sha256 {digest[:12]}… != "
            f"{spec.sha256[:12]}…): {FIX_HINT}"
        )
    return path
