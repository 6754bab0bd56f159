"""Quantization: the gate refuses bad variants and leaves the manifest alone; good ones
are registered and picked by ``precision=auto``; provider fallback and variant choice."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from facefuse.config import Settings
from facefuse.errors import BuildError
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.runtime.manifest import MANIFEST_NAME, Manifest, ModelSpec
from facefuse.runtime.registry import ModelRegistry, choose_variant
from facefuse.runtime.session import create_session, resolve_providers
from facefuse.toolchain.quantize import QuantizationGateError, QuantizeOptions
from facefuse.toolchain.quantize.calibration import (
    Augmentation,
    StageData,
    TensorReader,
    augment,
    build_stage_data,
    calibration_plan,
    draw_augmentations,
    evaluation_plan,
)
from facefuse.toolchain.quantize.evaluate import Evaluator, load_candidate
from facefuse.toolchain.quantize.fp16 import convert_fp16
from facefuse.toolchain.quantize.gate import (
    THRESHOLDS,
    check_detector,
    check_e2e,
    check_landmarks,
    check_recognizer,
    detector_figures,
    e2e_figures,
    landmark_figures,
    recognizer_figures,
)
from facefuse.toolchain.quantize.int8 import preprocess
from facefuse.toolchain.quantize.pipeline import Quantizer, copy_models_dir
from facefuse.toolchain.quantize.report import BEGIN, END, splice

#: The FP32 models the analysis pipeline (and so the calibration data) needs.
PIPELINE_MODELS = ("blazeface_full", "facemesh", "iris", "dlib_resnet")
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()

# -- the gate on real models ---------------------------------------------------------------


@pytest.fixture
def qsettings(tmp_path: Path, settings: Settings, model_dir: Path) -> Settings:
    """Settings on a private copy of the FP32 zoo: tests never touch the shared one."""
    models = copy_models_dir(model_dir, tmp_path / "models", PIPELINE_MODELS)
    # The copy holds the quantized pipeline's models only: BlazeFace is its detector.
    return settings.replace(models_dir=models, precision="auto", threads=1, detector="full")


@pytest.fixture(scope="module")
def stage_data(settings: Settings, model_dir: Path,
               sample_images: dict[str, np.ndarray]) -> tuple[StageData, StageData]:
    """Small calibration (2 augmentations per photo, obama3 held out) and evaluation
    (3 per photo, another seed) sets made by the FP32 pipeline."""
    fp32 = settings.replace(precision="fp32", threads=1)
    analyser = FaceAnalyser(fp32, ModelRegistry(fp32))
    names = sorted(sample_images)
    cal = build_stage_data(analyser, sample_images, calibration_plan(names, per_photo=2))
    ev = build_stage_data(analyser, sample_images, evaluation_plan(names, per_photo=3))
    return cal, ev


def _options(tmp_path: Path) -> QuantizeOptions:
    return QuantizeOptions(models=("dlib_resnet",), fmt="qdq-u8s8", calibration="minmax",
                           benchmark=False, report_dir=tmp_path / "report",
                           e2e_pairs=(("obama", "biden"),), min_speedup=0.0)


def test_gate_refuses_a_broken_int8_recognizer_and_leaves_the_manifest(
        qsettings: Settings, stage_data: tuple[StageData, StageData], tmp_path: Path) -> None:
    cal, ev = stage_data
    # Absurd calibration: every chip a flat grey. The activation ranges collapse, so real
    # faces saturate the INT8 model.
    broken = dataclasses.replace(cal, embed=[dataclasses.replace(c, tensor=np.full_like(
        c.tensor, 128.0)) for c in cal.embed])
    manifest_path = qsettings.model_dir / MANIFEST_NAME
    before = manifest_path.read_bytes()
    outcome = Quantizer(qsettings, _options(tmp_path), calibration=broken, evaluation=ev).run()

    assert not outcome.ok
    assert outcome.registered == []
    assert manifest_path.read_bytes() == before
    assert not (qsettings.model_dir / "dlib_resnet.int8.onnx").exists()
    assert choose_variant(Manifest.load(qsettings.model_dir), "dlib_resnet",
                          qsettings).precision == "fp32"
    [refusal] = outcome.refused
    assert refusal.figures["cos_min"] < THRESHOLDS.embed_cos_min
    with pytest.raises(QuantizationGateError) as info:
        outcome.raise_for_failures()
    assert "cosine" in info.value.message and "dlib_resnet.int8" in info.value.message
    assert info.value.exit_code != 0
    assert (tmp_path / "report" / "quantization.json").is_file()
    assert outcome.report["refused"]


def _black_chips(cal: StageData) -> StageData:
    """Calibration whose recogniser chips are all black: its INT8 model fails the gate."""
    return dataclasses.replace(cal, embed=[dataclasses.replace(c, tensor=c.tensor * 0.0)
                                           for c in cal.embed])


def test_cli_exits_non_zero_with_the_failing_figures(
        qsettings: Settings, stage_data: tuple[StageData, StageData], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from facefuse.cli import main

    cal, ev = stage_data
    broken = _black_chips(cal)
    monkeypatch.setattr(Quantizer, "build_data", lambda self: (broken, ev))
    monkeypatch.chdir(tmp_path)  # no ./BENCHMARKS.md to update here
    before = (qsettings.model_dir / MANIFEST_NAME).read_bytes()
    rc = main(["models", "quantize", "--models-dir", str(qsettings.model_dir), "--models",
               "dlib_resnet", "--format", "qdq-s8s8", "--calibration", "minmax", "--no-bench",
               "--report-dir", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert rc == QuantizationGateError.exit_code != 0
    assert "error[quantization_gate_failed]" in err and "embedding cosine" in err
    assert (qsettings.model_dir / MANIFEST_NAME).read_bytes() == before
    assert main(["models", "quantize", "--models-dir", str(qsettings.model_dir),
                 "--models", "age"]) == 2  # not a quantizable model: a usage error


def test_a_passing_int8_recognizer_is_registered_and_auto_picks_it(
        qsettings: Settings, stage_data: tuple[StageData, StageData], tmp_path: Path,
        sample_images: dict[str, np.ndarray]) -> None:
    cal, ev = stage_data
    outcome = Quantizer(qsettings, _options(tmp_path), calibration=cal, evaluation=ev).run()
    outcome.raise_for_failures()
    assert outcome.registered == ["dlib_resnet.int8"]

    manifest = Manifest.load(qsettings.model_dir)
    spec = manifest.get("dlib_resnet.int8")
    base = manifest.get("dlib_resnet")
    assert (spec.base, spec.precision, spec.inputs, spec.outputs) == (
        "dlib_resnet", "int8", base.inputs, base.outputs)
    assert spec.size * 3.5 <= base.size
    assert spec.extra["format"]["name"] == "qdq-u8s8"
    assert spec.extra["calibration"]["method"] == "minmax"
    assert spec.extra["host"]["onnxruntime"] == ort.__version__
    assert spec.extra["gate"]["figures"]["cos_min"] >= THRESHOLDS.embed_cos_min
    assert spec.extra["gate"]["e2e"]["id_sim_abs_diff_max"] <= THRESHOLDS.e2e_id_sim_diff
    assert spec.extra["base_sha256"] == base.sha256
    assert spec.extra["chip_padding"] == base.extra["chip_padding"]  # the base's extra kept

    auto = ModelRegistry(qsettings).get("dlib_resnet")
    fp32 = ModelRegistry(qsettings.replace(precision="fp32")).get("dlib_resnet")
    assert auto.spec.name == "dlib_resnet.int8" and fp32.spec.name == "dlib_resnet"
    # Real faces: the INT8 embedding agrees with FP32.
    analyser = FaceAnalyser(qsettings.replace(precision="fp32"))
    rgb = sample_images["biden"]
    x = analyser.models.recognizer.preprocess(stages.chips(rgb, analyser.analyse(rgb, embed=False)))
    a, b = fp32.run(x)[0][0], auto.run(x)[0][0]
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.995


def test_missing_judges_each_fp32_file_once_and_a_refusal_is_a_warning(
        qsettings: Settings, stage_data: tuple[StageData, StageData], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from facefuse.cli import main
    from facefuse.toolchain.quantize.verdicts import VERDICTS_NAME, load_verdicts

    cal, ev = stage_data
    broken = _black_chips(cal)
    sets = [(broken, ev)]  # the last is what a run gets
    runs: list[Quantizer] = []
    real_build_data = Quantizer.build_data

    def build_data(self: Quantizer) -> tuple[StageData, StageData]:
        runs.append(self)
        self._calibration, self._evaluation = sets[-1]
        return real_build_data(self)

    monkeypatch.setattr(Quantizer, "build_data", build_data)
    monkeypatch.chdir(tmp_path)
    argv = ["models", "quantize", "--models-dir", str(qsettings.model_dir), "--models",
            "dlib_resnet", "--format", "qdq-u8s8", "--calibration", "minmax", "--no-bench",
            "--report-dir", str(tmp_path / "report"), "--missing"]
    # A refusal under --missing: a warning, exit 0, FP32 stays, the verdict recorded.
    assert main(argv) == 0
    assert "warning: " in capsys.readouterr().err
    base = Manifest.load(qsettings.model_dir).get("dlib_resnet")
    verdict = load_verdicts(qsettings.model_dir)["dlib_resnet"]["int8"]
    assert (verdict["outcome"], verdict["base_sha256"]) == ("refused", base.sha256)
    assert len(runs) == 1
    # The same FP32 file and request again: nothing is judged.
    assert main(argv) == 0
    assert "judged before, not again" in capsys.readouterr().out and len(runs) == 1
    # Another request (format) is judged; so is a rebuilt FP32 file (another sha256).
    options = QuantizeOptions(models=("dlib_resnet",), fmt="qdq-u8s8", calibration="minmax",
                              benchmark=False, report_dir=tmp_path / "report",
                              e2e_pairs=(("obama", "biden"),), min_speedup=0.0, missing=True)
    path = qsettings.model_dir / VERDICTS_NAME
    path.write_text(path.read_text().replace(base.sha256, "0" * 64))
    sets.append((cal, ev))
    outcome = Quantizer(qsettings, options).run()
    assert outcome.registered == ["dlib_resnet.int8"] and len(runs) == 2
    assert Quantizer(qsettings, options).run().skipped == ["dlib_resnet"]
    # A registered verdict stands only while its variant does.
    manifest = Manifest.load(qsettings.model_dir)
    del manifest.models["dlib_resnet.int8"]
    manifest.save(qsettings.model_dir)
    assert Quantizer(qsettings, options).run().registered == ["dlib_resnet.int8"]
    assert len(runs) == 3
    # A variant in the manifest (a full search's, say) stands without a verdict.
    path.unlink()
    assert Quantizer(qsettings, options).run().skipped == ["dlib_resnet"]
    # Verdicts of another shape read as none: no crash, the model is judged again.
    path.write_text('{"dlib_resnet": {"int8": null, "fp16": []}, "iris": "x"}')
    manifest = Manifest.load(qsettings.model_dir)
    del manifest.models["dlib_resnet.int8"]
    manifest.save(qsettings.model_dir)

    def broken_quantizer(*args: object, **kwargs: object) -> None:
        raise MemoryError("no room")

    # An error before any gate (every candidate fails to build): no verdict is kept, so
    # the next run tries again; under --missing the CLI warns and FP32 stays.
    monkeypatch.setattr("facefuse.toolchain.quantize.pipeline.quantize_int8",
                        broken_quantizer)
    outcome = Quantizer(qsettings, options).run()
    assert outcome.registered == [] and outcome.refused and len(runs) == 4
    assert "dlib_resnet" not in load_verdicts(qsettings.model_dir)
    assert main(argv) == 0 and len(runs) == 5
    assert "warning: " in capsys.readouterr().err

    def no_samples(self: Quantizer) -> tuple[StageData, StageData]:
        raise BuildError("the sample photos could not be fetched")

    monkeypatch.setattr(Quantizer, "build_data", no_samples)
    assert main(argv) == 0
    assert "no variant made (build_failed" in capsys.readouterr().err
    assert main([a for a in argv if a != "--missing"]) == BuildError.exit_code


def test_fp16_recognizer_runs_on_this_host_and_is_judged(
        settings: Settings, model_dir: Path, stage_data: tuple[StageData, StageData],
        tmp_path: Path) -> None:
    _, ev = stage_data
    fp32 = settings.replace(precision="fp32")
    reg = ModelRegistry(fp32)
    base = reg.manifest.get("dlib_resnet")
    path = convert_fp16(model_dir / base.file, tmp_path / "dlib_resnet.fp16.onnx")
    candidate = load_candidate(base, path, fp32, "fp16")
    assert candidate.spec.precision == "fp16" and candidate.spec.size < 0.6 * base.size
    result = Evaluator(ev, {"dlib_resnet": reg.get("dlib_resnet")}, fp32).judge(
        "dlib_resnet", candidate)
    assert result.passed, result.failures
    assert result.figures["cos_min"] > 0.999


# -- providers and precision ---------------------------------------------------------------


def test_cuda_request_falls_back_to_cpu_with_a_logged_reason(
        caplog: pytest.LogCaptureFixture, settings: Settings, model_dir: Path) -> None:
    s = settings.replace(providers=("cuda", "cpu"))
    with caplog.at_level(logging.WARNING, logger="facefuse.runtime.session"):
        providers = resolve_providers(s)
    if HAS_CUDA:
        assert providers[0] == "CUDAExecutionProvider"
        return
    assert providers == ["CPUExecutionProvider"]
    assert any("CUDAExecutionProvider" in r.getMessage() and "not available" in r.getMessage()
               for r in caplog.records)
    session = create_session(model_dir / "dlib_resnet.onnx", s)
    assert session.get_providers() == ["CPUExecutionProvider"]


def _variants(base: ModelSpec, *precisions: str) -> Manifest:
    models = {base.name: base}
    for p in precisions:
        models[f"{base.name}.{p}"] = dataclasses.replace(
            base, name=f"{base.name}.{p}", file=f"{base.name}.{p}.onnx", precision=p,
            base=base.name)
    return Manifest(models)


def test_choose_variant_by_precision_and_device(
        registry: ModelRegistry, caplog: pytest.LogCaptureFixture) -> None:
    base = registry.manifest.get("dlib_resnet")
    both = _variants(base, "int8", "fp16")
    cpu = Settings(precision="auto", providers=("cpu",))
    cuda = Settings(precision="auto", providers=("cuda", "cpu"))
    assert choose_variant(both, "dlib_resnet", cpu).precision == "int8"
    # CUDA asked for: FP16 where CUDA exists, else the CPU choice (INT8).
    assert choose_variant(both, "dlib_resnet", cuda).precision == ("fp16" if HAS_CUDA
                                                                   else "int8")
    assert choose_variant(both, "dlib_resnet", cpu.replace(precision="fp16")).precision == "fp16"
    assert choose_variant(both, "dlib_resnet", cpu.replace(precision="fp32")).precision == "fp32"
    # auto without a gated variant: FP32, silently.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="facefuse.runtime.registry"):
        assert choose_variant(_variants(base), "dlib_resnet", cpu).precision == "fp32"
    assert not caplog.records
    # An explicit precision with no variant: FP32 with a logged reason.
    with caplog.at_level(logging.WARNING, logger="facefuse.runtime.registry"):
        got = choose_variant(_variants(base, "fp16"), "dlib_resnet",
                             cpu.replace(precision="int8"))
    assert got.precision == "fp32"
    assert any("no int8 variant" in r.getMessage() for r in caplog.records)


# -- gate arithmetic -----------------------------------------------------------------------


def test_recognizer_gate_figures() -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 128)) * 0.1
    ref = np.concatenate([c + rng.normal(size=(6, 128)) * 0.01 for c in centres])
    ids = [str(i) for i in range(3) for _ in range(6)]
    same = recognizer_figures(ref, ref.copy(), ids, 0.6)
    assert same["cos_min"] == pytest.approx(1.0) and same["decision_agreement"] == 1.0
    assert same["pairs"] == 18 * 17 // 2 and not check_recognizer(same)
    noisy = recognizer_figures(ref, ref + rng.normal(size=ref.shape) * 0.05, ids, 0.6)
    assert noisy["cos_mean"] < 0.995
    assert any("cosine mean" in f for f in check_recognizer(noisy))
    # Tiny changes that push pairs across the threshold flip decisions.
    flip = recognizer_figures(ref, ref * 1.3, ids, 0.2)
    assert flip["cos_min"] == pytest.approx(1.0) and flip["decisions_flipped"] > 0
    assert any("decisions agree" in f for f in check_recognizer(flip))


def test_detector_gate_figures() -> None:
    box = np.array([[100.0, 100.0, 200.0, 200.0]])
    kps = np.tile(np.array([[120.0, 130.0]]), (1, 6, 1))
    ok = detector_figures([(box, kps)], [(box + 1.0, kps + 0.5)])
    assert ok["faces_matched"] == 1 and ok["faces_extra"] == 0 and not check_detector(ok)
    moved = detector_figures([(box, kps)], [(box, kps + 2.0)])  # 2.8 px of 100 px width
    assert moved["kp_err_mean"] == pytest.approx(np.hypot(2, 2) / 100)
    assert any("keypoint error" in f for f in check_detector(moved))
    missed = detector_figures([(box, kps)], [(np.zeros((0, 4)), np.zeros((0, 6, 2)))])
    assert missed["faces_matched"] == 0 and check_detector(missed)
    shifted = detector_figures([(box, kps)], [(box + 20.0, kps)])  # IoU 0.47: another face
    assert shifted["faces_matched"] == 0 and shifted["faces_extra"] == 1
    extra = detector_figures([(box, kps)], [(np.vstack([box, box + 300]),
                                             np.concatenate([kps, kps + 300]))])
    assert any("FP32 does not find" in f for f in check_detector(extra))


def test_landmark_and_e2e_gate_figures() -> None:
    pts = np.random.default_rng(1).uniform(0, 100, (468, 2))
    fig = landmark_figures([pts], [pts + np.array([0.3, 0.4])], [60.0])  # 0.5 px of 60 px
    assert fig["err_mean"] == pytest.approx(0.5 / 60) and not check_landmarks(fig)
    bad = landmark_figures([pts], [pts + np.array([0.6, 0.8])], [60.0])
    assert check_landmarks(bad)
    assert not check_e2e(e2e_figures([0.9, 0.8], [0.895, 0.806]))
    assert check_e2e(e2e_figures([0.9, 0.8], [0.88, 0.8]))


# -- data and report -----------------------------------------------------------------------


def test_augmentations_are_seeded_and_disjoint(sample_images: dict[str, np.ndarray]) -> None:
    a = draw_augmentations(1, "obama", 5)
    assert a == draw_augmentations(1, "obama", 5)
    assert a != draw_augmentations(2, "obama", 5) and a != draw_augmentations(1, "biden", 5)
    names = sorted(sample_images)
    cal, ev = calibration_plan(names), evaluation_plan(names)
    assert cal.seed != ev.seed and "obama3" not in cal.photos and "obama3" in ev.photos
    rgb = sample_images["obama"]
    out = augment(rgb, Augmentation(flip=True, scale=0.8, angle=10.0, brightness=1.2,
                                    jpeg_quality=50))
    assert out.shape == rgb.shape and out.dtype == np.uint8
    assert np.array_equal(augment(rgb, Augmentation(flip=True))[:, ::-1], rgb)


def test_stage_data_holds_real_inputs(stage_data: tuple[StageData, StageData]) -> None:
    cal, ev = stage_data
    assert cal.skipped == 0 and ev.skipped == 0
    assert ev.tensors("dlib_resnet").shape == (15, 3, 150, 150)
    assert ev.tensors("iris").shape == (30, 3, 64, 64)
    det = ev.tensors("blazeface_full")  # whole images, plus tiles of the large ones
    items = ev.detect["blazeface_full"]
    assert len(items) == 15 and det.shape == (sum(len(it.tensors) for it in items), 3, 192, 192)
    assert det.shape[0] > 15 and det.min() >= -1.0 and det.max() <= 1.0
    assert {c.identity for c in ev.embed} == {"obama", "biden", "collins"}
    assert cal.tensors("dlib_resnet").shape == (8, 3, 150, 150)  # 4 photos × 2
    reader = TensorReader("input", ev.tensors("dlib_resnet"), batch_size=4)
    batches = [b["input"].shape[0] for b in iter(reader.get_next, None)]
    assert batches == [4, 4, 4, 3] and len(reader) == 4
    reader.rewind()
    assert reader.get_next() is not None


def test_report_section_replaces_only_its_markers() -> None:
    doc = "# Benchmarks\n\n<!-- analyse:begin -->\nA\n<!-- analyse:end -->\n"
    once = splice(doc, "first")
    assert once.startswith(doc) and f"{BEGIN}\nfirst\n{END}" in once
    twice = splice(once, "second")
    assert "first" not in twice and "second" in twice and twice.count(BEGIN) == 1
    assert "<!-- analyse:begin -->\nA\n<!-- analyse:end -->" in twice


def test_preprocessing_leaves_nothing_in_the_working_directory(
        model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BlazeFace's Resize ops defeat ORT's symbolic shape inference, which then saves
    its partial model into the working directory; ours must stay empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    spec = Manifest.load(model_dir).get("blazeface_full")
    done = preprocess(model_dir / spec.file, tmp_path / "out" / "pre.onnx")
    assert "onnx shapes" in done  # the fallback ran: symbolic inference gave up
    assert (tmp_path / "out" / "pre.onnx").is_file()
    assert list(cwd.iterdir()) == []
