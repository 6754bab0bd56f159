"""Batch fusion from the command line: folders, globs and CSV pairs; bad files
skipped with their codes; atomic outputs; a rerun resumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from facefuse.cli import main as cli_main
from facefuse.imaging.decode import decode_image
from facefuse.imaging.encode import encode_image


@pytest.fixture
def inbox(sample_paths, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(sample_paths["biden"], d / "biden.jpg")
    shutil.copy(sample_paths["obama2"], d / "obama2.jpg")
    (d / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    (d / "wall.png").write_bytes(encode_image(np.full((240, 240, 3), 128, np.uint8), "png"))
    (d / "notes.txt").write_text("not an image: ignored by the directory scan")
    return d


def test_folder_batch_reports_skips_and_resumes(sample_paths: dict[str, Path], inbox: Path,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out, report = tmp_path / "out", tmp_path / "report.json"
    args = ["fuse", str(sample_paths["astronaut"]), "--targets", str(inbox), "--out-dir",
            str(out), "--jobs", "2", "--format", "png", "--json-report", str(report),
            "--no-progress", "--degree", "70"]
    assert cli_main(args) == 1  # some files failed
    body = json.loads(report.read_text())
    assert sorted(Path(p).name for p in body["done"]) == ["biden.png", "obama2.png"]
    codes = {Path(f["target"]).name: f["code"] for f in body["failed"]}
    assert codes == {"broken.jpg": "corrupt_image", "wall.png": "target_no_face"}
    err = capsys.readouterr().err
    assert "failed[target_no_face]" in err and "failed[corrupt_image]" in err
    for name, sample in (("biden.png", "biden"), ("obama2.png", "obama2")):
        fused = decode_image(out / name)
        target = decode_image(sample_paths[sample])
        assert fused.shape == target.shape
        assert np.any(fused != target)
        assert b"compositeSynthetic" in (out / name).read_bytes()
    assert sorted(p.name for p in out.iterdir()) == ["biden.png", "obama2.png"]  # no temp files
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    assert cli_main(args) == 1
    body = json.loads(report.read_text())
    assert body["counts"] == {"done": 0, "skipped": 2, "failed": 2}
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


def test_glob_and_csv_pairs(sample_paths, inbox: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "globbed"
    rc = cli_main(["fuse", str(sample_paths["astronaut"]), "--targets", str(inbox / "o*.jpg"),
                   "--out-dir", str(out), "--no-progress"])
    assert rc == 0
    assert [p.name for p in out.iterdir()] == ["obama2.jpg"]

    pairs = tmp_path / "pairs.csv"
    shutil.copy(sample_paths["obama"], tmp_path / "obama.jpg")
    pairs.write_text("source,target,output\n"
                     "obama.jpg,in/biden.jpg,a.webp\n"
                     f"{sample_paths['astronaut']},in/obama2.jpg,\n"
                     "missing.jpg,in/biden.jpg,c.jpg\n")
    report = tmp_path / "pairs.json"
    rc = cli_main(["fuse", "--pairs", str(pairs), "--out-dir", str(tmp_path / "pairs"),
                   "--json-report", str(report), "--no-progress"])
    assert rc == 1
    body = json.loads(report.read_text())
    assert sorted(Path(p).name for p in body["done"]) == ["a.webp", "obama2.jpg"]
    assert [f["code"] for f in body["failed"]] == ["file_not_found"]
    assert decode_image(tmp_path / "pairs" / "a.webp").shape == decode_image(
        sample_paths["biden"]).shape


def test_batch_usage_errors(sample_paths, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli_main(["fuse", str(sample_paths["obama"]), "--targets", str(tmp_path)]) == 2
    assert "--out-dir" in capsys.readouterr().err
    assert cli_main(["fuse", str(sample_paths["obama"]), "--targets", str(tmp_path),
                     "--out-dir", str(tmp_path / "o")]) == 2
    assert "error[no_targets]" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("only-one-column\n")
    assert cli_main(["fuse", "--pairs", str(bad), "--out-dir", str(tmp_path / "o")]) == 2
    assert "error[invalid_pairs]" in capsys.readouterr().err
    assert cli_main(["fuse", str(sample_paths["obama"]), "-o", str(tmp_path / "x.jpg")]) == 2
