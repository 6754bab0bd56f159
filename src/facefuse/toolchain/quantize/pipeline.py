"""``facefuse models quantize``: calibrate, quantize, gate, measure, register, report.

1. Build calibration and evaluation inputs from the sample photos with the
   FP32 pipeline (:mod:`.calibration`; different seeds, one photo held out).
2. Per model: ``quant_pre_process``, then every requested (format ×
   calibration method × output heads INT8 or FP32) candidate; each is judged by
   the gate (:mod:`.gate`) against FP32 on the evaluation inputs. Per format the
   most accurate passing candidate is kept; of those, the fastest on this host at
   batch 8 — and only if it beats FP32 (``QuantizeOptions.min_speedup``): an INT8
   model that passes but runs slower is reported, not registered.
3. The end-to-end gate fuses sample pairs with the kept variants swapped in
   (all INT8 variants together; a failure refuses them all).
4. Measurements (size, load RSS in fresh processes, latency at batch 1/8 and
   1/2 threads, whole-analysis time) and the report.
5. Only variants that passed every gate are written into the manifest as
   ``<model>.int8`` / ``<model>.fp16``; a failure leaves the manifest as it was
   for that model and :meth:`QuantizeOutcome.raise_for_failures` raises
   :class:`~facefuse.errors.QuantizationGateError` with the figures.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError, QuantizationGateError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.detectors import detector_of_model
from facefuse.runtime.manifest import Manifest, ModelSpec
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.host import describe_line
from facefuse.toolchain.quantize.bench import analysis_latency, compare_latency, load_rss
from facefuse.toolchain.quantize.calibration import (
    MODEL_TASKS,
    StageData,
    build_stage_data,
    calibration_plan,
    calibration_reader,
    evaluation_plan,
    load_photos,
)
from facefuse.toolchain.quantize.evaluate import (
    E2E_PAIRS,
    Evaluator,
    OverlayRegistry,
    end_to_end,
    load_candidate,
    variant_spec,
)
from facefuse.toolchain.quantize.fp16 import BLOCKLISTS, convert_fp16
from facefuse.toolchain.quantize.gate import GateResult
from facefuse.toolchain.quantize.int8 import (
    FORMATS,
    METHODS,
    host_info,
    output_heads,
    preprocess,
    quantize_int8,
)
from facefuse.toolchain.quantize.report import write_report
from facefuse.toolchain.quantize.verdicts import Outcome, judged, record
from facefuse.toolchain.samples import fetch_samples

log = logging.getLogger(__name__)

#: Models quantized when none are named (the detector, the mesh with iris, the recognizer).
DEFAULT_MODELS: tuple[str, ...] = ("blazeface_full", "facemesh", "iris", "dlib_resnet")
#: Bump when the quantizer's output changes.
QUANTIZER_VERSION = "facefuse-quantize.1"


@dataclass(frozen=True)
class QuantizeOptions:
    """What ``facefuse models quantize`` does (see the CLI for the flags)."""

    models: tuple[str, ...] = DEFAULT_MODELS
    fmt: str = "auto"  # auto | qdq-u8s8 | qop-u8s8 | qdq-s8s8
    calibration: str = "auto"  # auto | minmax | percentile | entropy
    int8: bool = True
    fp16: bool = False
    report_dir: Path | None = None
    benchmarks: Path | None = None
    calibration_per_photo: int = 12
    evaluation_per_photo: int = 12
    benchmark: bool = True
    e2e_pairs: tuple[tuple[str, str], ...] = E2E_PAIRS
    #: An INT8 variant that passes the gate is kept only when it is at least this much
    #: faster than FP32 (geometric mean of the batch-1 and batch-8 speed-ups).
    min_speedup: float = 1.05
    #: Judge only the models with no recorded verdict for their current FP32 file and
    #: this request (:mod:`.verdicts`); a refusal is then recorded, not an error.
    missing: bool = False
    command: str = "facefuse models quantize"

    def precisions(self) -> list[str]:
        """The variant precisions asked for."""
        return [p for p, on in (("int8", self.int8), ("fp16", self.fp16)) if on]

    def request(self) -> str:
        """What a recorded verdict must match to stand for this run."""
        return f"{self.fmt}/{self.calibration}/{QUANTIZER_VERSION}"

    def formats(self) -> list[str]:
        return list(FORMATS) if self.fmt == "auto" else [self.fmt]

    def methods(self) -> list[str]:
        return list(METHODS) if self.calibration == "auto" else [self.calibration]

    def validate(self) -> None:
        if self.fmt != "auto" and self.fmt not in FORMATS:
            raise InvalidArgumentError(
                f"--format must be auto|{'|'.join(FORMATS)}, not {self.fmt!r}")
        if self.calibration != "auto" and self.calibration not in METHODS:
            raise InvalidArgumentError(
                f"--calibration must be auto|{'|'.join(METHODS)}, not {self.calibration!r}")
        for m in self.models:
            if m not in MODEL_TASKS:
                raise InvalidArgumentError(
                    f"cannot quantize {m!r}: supported models are {', '.join(MODEL_TASKS)}")
        if self.calibration_per_photo < 1 or self.evaluation_per_photo < 1:
            raise InvalidArgumentError("per-photo augmentation counts must be >= 1")


@dataclass
class Candidate:
    """One quantized attempt and its verdict."""

    model: str
    precision: str
    fmt: str
    method: str
    path: Path | None
    result: GateResult | None
    error: str | None = None
    latency_b8: float | None = None
    chosen: bool = False
    #: Nodes left in FP32 (the output heads), empty when everything is quantized.
    fp32_nodes: tuple[str, ...] = ()
    #: Wall time to quantize (incl. calibration when not cached) and judge it.
    seconds: float = 0.0
    #: The execution provider the gate ran it on.
    provider: str = "CPUExecutionProvider"

    @property
    def label(self) -> str:
        return f"{self.fmt}/{self.method}/{'heads-fp32' if self.fp32_nodes else 'all'}"

    @property
    def passed(self) -> bool:
        return self.result is not None and self.result.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.fmt, "calibration": self.method, "passed": self.passed,
            "figures": self.result.figures if self.result else None,
            "failures": self.result.failures if self.result else [self.error or "failed"],
            "error": self.error, "latency_b8": self.latency_b8, "chosen": self.chosen,
            "fp32_nodes": list(self.fp32_nodes), "seconds": round(self.seconds, 2),
        }


@dataclass
class QuantizeOutcome:
    """What happened: the report, the registered variants and the refusals."""

    report: dict[str, Any]
    registered: list[str] = field(default_factory=list)
    refused: list[GateResult] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    #: Models not judged (``missing``): a verdict for their FP32 file stands.
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused

    def raise_for_failures(self) -> None:
        """Raise :class:`QuantizationGateError` naming every failing figure."""
        if self.refused:
            lines = [r.summary() for r in self.refused]
            raise QuantizationGateError(
                "accuracy gate refused " + ", ".join(r.subject for r in self.refused)
                + " (not written into the manifest):\n  " + "\n  ".join(lines))


def _accuracy_loss(task: str, fig: Mapping[str, Any]) -> float:
    """Lower is better: how far a candidate is from FP32, for picking a method."""
    if task == "embed":
        return 1.0 - float(fig["cos_mean"])
    if task == "detect":
        return float(fig["kp_err_mean"] or 0.0) + (1.0 - float(fig["iou_mean"] or 0.0))
    return float(fig["err_mean"])


def _refusal(name: str, cands: Sequence[Candidate]) -> tuple[GateResult, dict[str, Any]]:
    """The refusal of a model none of whose INT8 candidates passed: every candidate's
    failures, and the figures of the most accurate one."""
    failures = [f"{c.label}: " + ("; ".join(c.result.failures) if c.result else str(c.error))
                for c in cands] or ["nothing was quantized"]
    judged = [(c, c.result) for c in cands if c.result is not None]
    best = min(judged, key=lambda cr: _accuracy_loss(MODEL_TASKS[name], cr[1].figures),
               default=None)
    figures = best[1].figures if best else {}
    entry = {"passed": False, "failures": failures, "figures": figures or None,
             "format": best[0].fmt if best else "–",
             "calibration": best[0].method if best else "–"}
    return GateResult(f"{name}.int8", figures, failures), entry


def _load_average() -> list[float] | None:
    """1/5/15-minute load averages (other processes competing for the cores)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


@dataclass
class _Verdicts:
    """What the gates decided so far: kept variants per precision, INT8 variants that
    passed but are not faster (measured, not registered), and every refusal."""

    kept: dict[str, dict[str, Candidate]] = field(
        default_factory=lambda: {"int8": {}, "fp16": {}})
    unkept: dict[str, Candidate] = field(default_factory=dict)
    refused: list[GateResult] = field(default_factory=list)


def _outcome(name: str, precision: str, registered: Sequence[str],
             entry: Mapping[str, Any]) -> Outcome | None:
    """What the run decided for ``name``'s ``precision`` variant, from its report
    ``entry`` (``report["models"][name]``); None when nothing reached a gate (an
    error on the way: no verdict, the next run tries again)."""
    if f"{name}.{precision}" in registered:
        return "registered"
    judged = entry.get(precision) or {}
    if judged.get("kept") is False:
        return "not faster"
    if judged.get("passed") is False and judged.get("figures"):
        return "refused"  # by its own gate or end to end
    return None


class Quantizer:
    """Runs one ``facefuse models quantize`` (see the module docstring)."""

    def __init__(self, settings: Settings, options: QuantizeOptions,
                 *, calibration: StageData | None = None,
                 evaluation: StageData | None = None) -> None:
        options.validate()
        self.settings = settings
        self.options = options
        # The reference pipeline: FP32 everywhere, full-range detector for finding faces.
        # INT8 is the CPU path: its candidates are built, judged and timed on the CPU EP.
        self.ref_settings = settings.replace(precision="fp32", detector="full",
                                             providers=("cpu",))
        self.registry = ModelRegistry(self.ref_settings)
        self.models_dir = settings.model_dir
        self.threads = settings.threads or 1
        self._calibration = calibration
        self._evaluation = evaluation
        self.photo_paths: dict[str, Path] = {}
        self.notes: list[str] = []
        #: Per model, what the pre-processing did (opset conversion, shape inference).
        self.preprocessing: dict[str, str] = {}

    # -- data -------------------------------------------------------------------------

    def build_data(self) -> tuple[StageData, StageData]:
        """The calibration and evaluation sets (built from the sample photos unless given)."""

        self.photo_paths = fetch_samples(self.settings.samples_dir, self.settings.downloads_dir)
        if self._calibration is not None and self._evaluation is not None:
            return self._calibration, self._evaluation
        photos = load_photos(self.photo_paths)
        analyser = FaceAnalyser(self.ref_settings, self.registry)
        # The other detectors quantized record their inputs beside the analyser's.
        own = analyser.models.detector.model.spec.name
        extra = {name: detector_of_model(self.registry.get(name), self.settings)
                 for name in self.options.models
                 if MODEL_TASKS.get(name) == "detect" and name != own}
        names = sorted(photos)
        cal = self._calibration or build_stage_data(
            analyser, photos, calibration_plan(names, self.options.calibration_per_photo),
            detectors=extra)
        ev = self._evaluation or build_stage_data(
            analyser, photos, evaluation_plan(names, self.options.evaluation_per_photo),
            detectors=extra)
        if cal.plan.seed == ev.plan.seed and set(cal.plan.photos) & set(ev.plan.photos):
            raise InvalidArgumentError("calibration and evaluation data are not disjoint")
        return cal, ev

    # -- candidates -------------------------------------------------------------------

    def int8_candidates(self, name: str, spec: ModelSpec, cal: StageData, evaluator: Evaluator,
                        work: Path) -> list[Candidate]:
        """Every (calibration method × format × heads INT8/FP32) candidate, judged."""
        pre = work / f"{name}.pre.onnx"
        self.preprocessing[name] = preprocess(self.models_dir / spec.file, pre)
        heads = tuple(output_heads(pre))
        reader = calibration_reader(cal, name, spec.inputs[0].name)
        out: list[Candidate] = []
        for method in self.options.methods():
            cache = work / f"{name}.{method}.ranges.json"
            for fmt in self.options.formats():
                for keep in ((), heads) if heads else ((),):
                    tag = "heads-fp32" if keep else "all"
                    dst = work / f"{name}.int8.{fmt}.{method}.{tag}.onnx"
                    t0 = time.perf_counter()
                    try:
                        quantize_int8(pre, dst, reader, FORMATS[fmt], method, cache=cache,
                                      nodes_to_exclude=list(keep))
                        model = load_candidate(spec, dst, self.ref_settings, "int8")
                        result = evaluator.judge(name, model)
                        result.subject = f"{name}.int8 ({fmt}, {method}, {tag})"
                        cand = Candidate(name, "int8", fmt, method, dst, result, fp32_nodes=keep)
                    except Exception as exc:  # a candidate that cannot be built has failed
                        log.warning("%s %s/%s/%s failed: %s", name, fmt, method, tag, exc)
                        cand = Candidate(name, "int8", fmt, method, None, None, fp32_nodes=keep,
                                         error=f"{type(exc).__name__}: {exc}")
                    cand.seconds = time.perf_counter() - t0
                    out.append(cand)
                    log.info("%s int8 %s/%s/%s: %s (%.1fs)", name, fmt, method, tag,
                             cand.result.summary() if cand.result else cand.error, cand.seconds)
        return out

    def choose(self, name: str, candidates: list[Candidate], evaluator: Evaluator
               ) -> tuple[Candidate | None, dict[str, Any]]:
        """Pick the INT8 variant to keep, and say why.

        Per format the most accurate passing candidate; of those the fastest at
        batch 8 (interleaved with FP32). It is kept only when it also beats FP32:
        the geometric mean of its batch-1 and batch-8 speed-ups must reach
        ``options.min_speedup``. Returns ``(candidate or None, figures)``; the
        candidate is None when nothing passed the gate, and ``figures["kept"]``
        is False when the best one is not worth it.
        """
        import math


        task = MODEL_TASKS[name]
        best: dict[str, Candidate] = {}
        for c in candidates:
            if not c.passed or c.result is None or c.path is None:
                continue
            cur = best.get(c.fmt)
            if cur is None or cur.result is None or (
                    _accuracy_loss(task, c.result.figures)
                    < _accuracy_loss(task, cur.result.figures)):
                best[c.fmt] = c
        if not best:
            return None, {"kept": False, "reason": "no candidate passed the gate"}
        if len(best) == 1 and self.options.min_speedup <= 0:
            only = next(iter(best.values()))
            only.chosen = True
            return only, {"kept": True, "reason": "only candidate; speed not required"}
        tensors = evaluator.data.tensors(name)
        fp32_path = self.models_dir / evaluator.fp32[name].spec.file
        paths: dict[str, Path] = {"fp32": fp32_path}
        paths.update({f: c.path for f, c in best.items() if c.path is not None})
        b8 = compare_latency(paths, tensors, batch=8, threads=self.threads, rounds=10,
                             min_seconds=2.0)
        for f, c in best.items():
            c.latency_b8 = b8[f]
        chosen = min(best.values(), key=lambda c: c.latency_b8 or float("inf"))
        chosen.chosen = True
        assert chosen.path is not None and chosen.latency_b8 is not None
        b1 = compare_latency({"fp32": fp32_path, "int8": chosen.path}, tensors, batch=1,
                             threads=self.threads, rounds=30, min_seconds=2.0)
        speedup = math.sqrt(b8["fp32"] / chosen.latency_b8 * b1["fp32"] / b1["int8"])
        info: dict[str, Any] = {
            "threads": self.threads,
            "ms_fp32": {"b1": b1["fp32"], "b8": b8["fp32"]},
            "ms_int8": {"b1": b1["int8"], "b8": chosen.latency_b8},
            "speedup_geomean_b1_b8": speedup,
            "min_speedup": self.options.min_speedup,
            "kept": speedup >= self.options.min_speedup,
        }
        if not info["kept"]:
            info["reason"] = (f"passes the gate but is not faster than FP32 on this host "
                              f"({speedup:.2f}× < {self.options.min_speedup}×): not registered")
        return chosen, info

    def fp16_candidate(self, name: str, spec: ModelSpec, evaluator: Evaluator,
                       work: Path) -> Candidate:

        dst = work / f"{name}.fp16.onnx"
        try:
            convert_fp16(self.models_dir / spec.file, dst, op_block_list=BLOCKLISTS.get(name))
            # Judged on the providers the settings ask for (CUDA where present, else CPU).
            model = load_candidate(spec, dst, self.settings.replace(precision="fp32"), "fp16")
            result = evaluator.judge(name, model)
            result.subject = f"{name}.fp16 ({model.provider})"
            return Candidate(name, "fp16", "fp16", "–", dst, result, provider=model.provider)
        except Exception as exc:
            return Candidate(name, "fp16", "fp16", "–", None, None,
                             error=f"{type(exc).__name__}: {exc}")

    # -- measurements -----------------------------------------------------------------

    def measure(self, name: str, entry: dict[str, Any], paths: Mapping[str, Path],
                evaluator: Evaluator) -> None:
        """Latency (batch 1/8 × 1/2 threads, interleaved) and load RSS of each variant."""

        tensors = evaluator.data.tensors(name)
        lat: dict[str, dict[str, float]] = {k: {} for k in paths}
        for batch in (1, 8):
            for threads in (1, 2):
                res = compare_latency(dict(paths), tensors, batch=batch, threads=threads,
                                      rounds=10 if batch == 8 else 30, min_seconds=2.0)
                for k, v in res.items():
                    lat[k][f"b{batch}_t{threads}"] = v
        entry["latency"] = lat
        entry["load_rss"] = {}
        for k, p in paths.items():
            try:
                entry["load_rss"][k] = load_rss(p, tensors.shape[1:], threads=1)
            except (RuntimeError, OSError, ValueError) as exc:
                entry["load_rss"][k] = {"error": str(exc)}

    def measure_analysis(self, int8: Mapping[str, Path]) -> dict[str, Any]:
        """Whole-analysis median ms per sample photo, FP32 vs INT8 variants, 1 and 2 threads."""

        images = list(load_photos(self.photo_paths).values())
        out: dict[str, Any] = {}
        base = self.ref_settings.replace(detector=self.settings.detector)
        for threads in (1, 2):
            s = base.replace(threads=threads)
            reg = ModelRegistry(s)
            overrides = {n: load_candidate(reg.manifest.get(n), p, s, "int8")
                         for n, p in int8.items()}
            analysers = {
                "fp32": FaceAnalyser(s, reg),
                "int8": FaceAnalyser(s, OverlayRegistry(s, overrides)),
            }
            out[f"{threads} thread{'s' if threads > 1 else ''}"] = analysis_latency(
                analysers, images, rounds=4)
        return out

    # -- registration -----------------------------------------------------------------

    def register(self, chosen: Sequence[tuple[Candidate, dict[str, Any]]]) -> list[str]:
        """Move passing files into the model directory and add their manifest entries."""
        if not chosen:
            return []
        manifest = Manifest.load(self.models_dir)  # fresh: others may have written meanwhile
        names = []
        for cand, extra in chosen:
            assert cand.path is not None
            base = manifest.get(cand.model)
            final = self.models_dir / f"{cand.model}.{cand.precision}.onnx"
            os.replace(cand.path, final)
            spec = variant_spec(base, final, cand.precision, extra)
            manifest.models[spec.name] = spec
            names.append(spec.name)
        manifest.save(self.models_dir)
        return names

    # -- the whole run ----------------------------------------------------------------

    def run(self) -> QuantizeOutcome:
        """Judge every candidate, gate end to end, measure, register, and report."""
        opts = self.options
        specs = self._base_specs()
        bases = {n: s.sha256 for n, s in specs.items()}
        present = {n for n, s in self.registry.manifest.models.items()
                   if s.base in bases and s.extra.get("base_sha256") == bases[s.base]
                   and (self.models_dir / s.file).is_file()}
        skipped = sorted(judged(self.models_dir, bases, opts.precisions(), opts.request(),
                                present) if opts.missing else ())
        if skipped:
            log.info("a verdict stands for %s: not judged again", ", ".join(skipped))
            specs = {n: s for n, s in specs.items() if n not in skipped}
            if not specs:
                return QuantizeOutcome({"skipped": skipped}, skipped=skipped)
        cal, ev = self.build_data()
        host = host_info()
        report = self._report_head(cal, ev, host)
        evaluator = Evaluator(ev, {n: self.registry.get(n) for n in specs}, self.ref_settings)
        verdicts = _Verdicts()
        self.models_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.models_dir, prefix=".quantize-") as tmp:
            for name, spec in specs.items():
                entry: dict[str, Any] = {
                    "task": MODEL_TASKS[name],
                    "fp32": {"file": spec.file, "size": spec.size, "sha256": spec.sha256},
                }
                report["models"][name] = entry
                if opts.int8:
                    self._judge_int8(name, spec, entry, cal, evaluator, Path(tmp), verdicts)
                if opts.fp16:
                    self._judge_fp16(name, spec, entry, evaluator, Path(tmp), verdicts)
            report["e2e"] = self._end_to_end(specs, report, verdicts)
            if opts.benchmark:
                self._measure_all(specs, report, verdicts, evaluator)
            report["load_average_end"] = _load_average()
            report["notes"] = self.notes
            registered = self.register([
                (c, self._manifest_extra(c, report, cal, ev, host))
                for chosen in verdicts.kept.values() for c in chosen.values()])
        report["registered"] = registered
        report["refused"] = [r.summary() for r in verdicts.refused]
        outcomes = {n: {p: _outcome(n, p, registered, report["models"][n])
                         for p in opts.precisions()} for n in specs}
        record(self.models_dir, {n: {p: o for p, o in per.items() if o is not None}
                                 for n, per in outcomes.items()}, bases, opts.request())
        report_dir = opts.report_dir or (self.settings.home / "reports")
        written = write_report(report, report_dir, opts.benchmarks, machine=report["machine"])
        return QuantizeOutcome(report, registered, verdicts.refused, written, skipped)

    def _base_specs(self) -> dict[str, ModelSpec]:
        """The FP32 base spec of every model asked for (a variant name is refused)."""
        manifest = self.registry.manifest
        specs = {}
        for name in self.options.models:
            spec = manifest.get(name)
            if spec.precision != "fp32" or spec.base is not None:
                raise InvalidArgumentError(f"{name!r} is not an FP32 base model")
            specs[name] = spec
        return specs

    def _report_head(self, cal: StageData, ev: StageData,
                     host: Mapping[str, Any]) -> dict[str, Any]:
        """The report's header: command, host, settings, data and how it is disjoint."""
        held_out = sorted(set(ev.plan.photos) - set(cal.plan.photos))
        disjoint = (
            f"calibration: {len(cal.images)} augmented images of {', '.join(cal.plan.photos)} "
            f"(seed {cal.plan.seed}, {cal.plan.per_photo} per photo); evaluation: "
            f"{len(ev.images)} augmented images of {', '.join(ev.plan.photos)} (seed "
            f"{ev.plan.seed}, {ev.plan.per_photo} per photo) — disjoint by augmentation seed"
            + (f", and {', '.join(held_out)} held out of calibration" if held_out else "")
            + ". Recognizer pairs: every pair of evaluation chips, labelled by the sample "
            "identities (obama ×3 photos, biden, collins) under augmentation — not LFW.")
        return {
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": self.options.command,
            "host": dict(host),
            "cores": os.cpu_count(),
            "settings": {"threads": self.threads, "providers": list(self.settings.providers)},
            "data": {"calibration": cal.summary(), "evaluation": ev.summary(),
                     "disjointness": disjoint},
            "models": {},
            "quantizer": QUANTIZER_VERSION,
            "load_average_start": _load_average(),
            "machine": describe_line(),
        }

    def _judge_int8(self, name: str, spec: ModelSpec, entry: dict[str, Any], cal: StageData,
                    evaluator: Evaluator, work: Path, verdicts: _Verdicts) -> None:
        """Make and gate the INT8 candidates of one model; keep the best that passes."""
        cands = self.int8_candidates(name, spec, cal, evaluator, work)
        chosen, choice = self.choose(name, cands, evaluator)
        entry["candidates"] = [c.to_json() for c in cands]
        entry["choice"] = choice
        if chosen is None:
            refusal, entry["int8"] = _refusal(name, cands)
            verdicts.refused.append(refusal)
        elif choice["kept"]:
            verdicts.kept["int8"][name] = chosen
        else:
            entry["int8"] = {**self._variant_json(chosen, passed=True),
                             "kept": False, "reason": choice["reason"]}
            verdicts.unkept[name] = chosen

    def _judge_fp16(self, name: str, spec: ModelSpec, entry: dict[str, Any],
                    evaluator: Evaluator, work: Path, verdicts: _Verdicts) -> None:
        """Make and gate the FP16 variant of one model."""
        fp16 = self.fp16_candidate(name, spec, evaluator, work)
        if fp16.passed:
            verdicts.kept["fp16"][name] = fp16
        else:
            verdicts.refused.append(fp16.result or GateResult(
                f"{name}.fp16", {}, [fp16.error or "conversion failed"]))
        entry["fp16"] = {
            "passed": fp16.passed, "format": "fp16 (IO fp32)", "calibration": "–",
            "figures": fp16.result.figures if fp16.result else None,
            "failures": fp16.result.failures if fp16.result else [fp16.error],
            "size": fp16.path.stat().st_size if fp16.path else None,
            "provider": fp16.provider,
        }

    def _end_to_end(self, specs: Mapping[str, ModelSpec], report: dict[str, Any],
                    verdicts: _Verdicts) -> dict[str, Any]:
        """The end-to-end gate per precision, every kept variant swapped in at once; a
        failing precision loses all its variants."""
        e2e: dict[str, Any] = {}
        for precision, chosen_map in verdicts.kept.items():
            if not chosen_map:
                continue
            load_with = (self.settings.replace(precision="fp32") if precision == "fp16"
                         else self.ref_settings)
            models = {n: load_candidate(specs[n], c.path, load_with, precision)
                      for n, c in chosen_map.items() if c.path is not None}
            g = end_to_end(self.ref_settings, models, self.photo_paths, self.options.e2e_pairs,
                           subject=f"end-to-end ({precision}: {', '.join(sorted(models))})")
            e2e[precision] = {"passed": g.passed, "figures": g.figures, "failures": g.failures}
            if not g.passed:
                verdicts.refused.append(g)
                failures = [f"end-to-end: {f}" for f in g.failures]
                for n, c in chosen_map.items():
                    report["models"][n][precision] = self._variant_json(
                        c, passed=False, extra_failures=failures)
                chosen_map.clear()
        for precision, chosen_map in verdicts.kept.items():
            for n, c in chosen_map.items():
                report["models"][n][precision] = self._variant_json(c, passed=True)
        return e2e

    def _measure_all(self, specs: Mapping[str, ModelSpec], report: dict[str, Any],
                     verdicts: _Verdicts, evaluator: Evaluator) -> None:
        """Latency and memory of FP32 and of every INT8 variant that passed (kept or not),
        and the whole analysis with the kept ones."""
        for name in specs:
            paths = {"fp32": self.models_dir / specs[name].file}
            int8 = verdicts.kept["int8"].get(name) or verdicts.unkept.get(name)
            if int8 is not None and int8.path is not None:
                paths["int8"] = int8.path
            self.measure(name, report["models"][name], paths, evaluator)
        kept = verdicts.kept["int8"]
        if kept:
            report["analysis_int8_models"] = sorted(kept)
            report["analysis"] = self.measure_analysis(
                {n: c.path for n, c in kept.items() if c.path is not None})

    @staticmethod
    def _variant_json(c: Candidate, *, passed: bool,
                      extra_failures: Sequence[str] = ()) -> dict[str, Any]:
        return {
            "passed": passed and c.passed,
            "format": c.fmt, "calibration": c.method, "fp32_nodes": list(c.fp32_nodes),
            "figures": c.result.figures if c.result else None,
            "failures": (c.result.failures if c.result else []) + list(extra_failures),
            "size": c.path.stat().st_size if c.path and c.path.exists() else None,
        }

    def _manifest_extra(self, c: Candidate, report: Mapping[str, Any], cal: StageData,
                        ev: StageData, host: Mapping[str, Any]) -> dict[str, Any]:
        entry = report["models"][c.model]
        extra: dict[str, Any] = {
            "quantizer": QUANTIZER_VERSION,
            "base_sha256": entry["fp32"]["sha256"],
            "host": dict(host),
            "gate": {"figures": c.result.figures if c.result else None,
                     "e2e": report.get("e2e", {}).get(c.precision, {}).get("figures"),
                     "judged_on": c.provider},
        }
        if c.precision == "int8":
            extra["format"] = {**FORMATS[c.fmt].describe(), "fp32_nodes": list(c.fp32_nodes)}
            extra["preprocessing"] = self.preprocessing.get(c.model)
            extra["calibration"] = {"method": c.method, "data": cal.summary()}
            extra["evaluation"] = ev.summary()
        else:
            extra["format"] = {"name": "fp16", "io": "float32",
                               "converter": "onnxconverter-common float16"}
            extra["evaluation"] = ev.summary()
        if "latency" in entry:
            extra["latency_ms"] = entry["latency"].get(c.precision)
        return extra


def quantize_models(settings: Settings, options: QuantizeOptions | None = None, **kw: Any
                    ) -> QuantizeOutcome:
    """Run ``facefuse models quantize`` as a library call (see :class:`Quantizer`)."""
    return Quantizer(settings, options or QuantizeOptions(), **kw).run()


def copy_models_dir(src: Path, dst: Path, names: Sequence[str] | None = None, *,
                    variants: bool = False) -> Path:
    """Copy a model directory (manifest + files) — for tests and dry runs that must
    not touch the real one.

    Args:
        names: only these base models (default: all).
        variants: also their INT8/FP16 variants (default: the FP32 models only, so a
            copy never depends on what was quantized in ``src``).
    """
    manifest = Manifest.load(src)
    dst.mkdir(parents=True, exist_ok=True)
    keep = Manifest({n: s for n, s in manifest.models.items()
                     if (names is None or (s.base or n) in names)
                     and (variants or s.base is None)})
    for spec in keep.models.values():
        shutil.copyfile(src / spec.file, dst / spec.file)
    keep.save(dst)
    return dst
