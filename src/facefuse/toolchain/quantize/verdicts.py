"""What ``facefuse models quantize`` last decided per model, kept beside the manifest.

``quantize --missing`` (what ``make models`` runs) judges only the models whose
current FP32 file has no verdict for the same request (precision, format,
calibration, quantizer version): a second run is free, a refusal or a variant
that is not faster on this host is not tried again at every start, and a
rebuilt FP32 model (a new sha256) is judged anew.

The file is ``<models_dir>/quantize-verdicts.json``::

    {"dlib_resnet": {"int8": {"base_sha256": "...", "request": "qop-u8s8/percentile/...",
                              "outcome": "registered" | "not faster" | "refused"}}}

A model none of whose candidates reached the gate (an error on the way: memory, a
broken install) gets no verdict, so the next run tries again. "Not faster" comes
from one timing on this host: run ``quantize`` without ``--missing``, or delete the
file, to judge again on a quieter machine.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from facefuse.runtime.files import atomic_write_text

VERDICTS_NAME = "quantize-verdicts.json"

Outcome = Literal["registered", "not faster", "refused"]


def load_verdicts(models_dir: Path) -> dict[str, dict[str, dict[str, str]]]:
    """Every recorded verdict. A missing file, one that does not parse, and entries
    of another shape read as no verdict: those models are judged again, which is
    always safe."""
    try:
        body: Any = json.loads((models_dir / VERDICTS_NAME).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(body, dict):
        return {}
    kept = {name: {p: v for p, v in per.items() if isinstance(v, dict)}
            for name, per in body.items() if isinstance(per, dict)}
    return {name: per for name, per in kept.items() if per}


def judged(models_dir: Path, bases: Mapping[str, str], precisions: Iterable[str],
           request: str, present: Container[str]) -> set[str]:
    """The models of ``bases`` (name → its FP32 file's sha256) with nothing left to
    judge: for every one of ``precisions``, either a variant ``<name>.<precision>``
    is in ``present`` (the manifest's variants made from that file, by this request
    or an earlier full search), or a verdict under ``request`` made from that file
    says it is not faster or was refused."""
    done = load_verdicts(models_dir)
    wanted = tuple(precisions)

    def stands(name: str, sha: str, precision: str) -> bool:
        if f"{name}.{precision}" in present:
            return True
        v = done.get(name, {}).get(precision, {})
        return (v.get("base_sha256") == sha and v.get("request") == request
                and v.get("outcome") in ("not faster", "refused"))

    return {name for name, sha in bases.items()
            if wanted and all(stands(name, sha, p) for p in wanted)}


def record(models_dir: Path, verdicts: Mapping[str, Mapping[str, Outcome]],
           bases: Mapping[str, str], request: str) -> None:
    """Add ``verdicts`` (model → precision → outcome) for the FP32 files of ``bases``,
    keeping what the file holds for other models and precisions (two runs writing at
    once may lose one's verdicts: those models are judged again)."""
    body = load_verdicts(models_dir)
    for name, per in verdicts.items():
        if not per:
            continue
        slot = body.setdefault(name, {})
        for precision, outcome in per.items():
            slot[precision] = {"base_sha256": bases[name], "request": request,
                               "outcome": outcome}
    atomic_write_text(models_dir / VERDICTS_NAME, json.dumps(body, indent=2) + "\n")
