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
    assert body["counts"] == {"done": 0, "skipped": 2, "failed": 2, "not_started": 0}
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


# --- robustness: memory, interrupts, unwritable outputs, paths, permissions, resume ----------

def _cli(*args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "facefuse.cli", "fuse", *args, "--no-progress"]


def _peak_rss_mb(*args: str) -> tuple[int, float]:
    """(exit status, peak RSS in MiB) of one CLI run in a fresh process."""
    import subprocess

    code = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], "
            "capture_output=True); print(p.returncode, "
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    import sys

    out = subprocess.run([sys.executable, "-c", code, *_cli(*args)], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), float(out[1])


def test_memory_is_flat_in_the_number_of_failed_targets(sample_paths, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """2000 empty targets peak within 100 MiB of 20 (each failure used to keep its
    traceback, and with it the decoded source: ~3 MB a file)."""
    peaks = []
    for n in (20, 2000):
        d = tmp_path / f"empty{n}"
        d.mkdir()
        for i in range(n):
            (d / f"e{i}.jpg").touch()
        rc, peak = _peak_rss_mb(str(sample_paths["obama"]), "--targets", str(d), "--out-dir",
                                str(tmp_path / f"out{n}"))
        assert rc == 1
        peaks.append(peak)
    assert peaks[1] - peaks[0] < 100, peaks


def test_first_ctrl_c_finishes_in_flight_writes_the_report_and_exits_130(
        sample_paths: dict[str, Path], tmp_path: Path) -> None:
    import signal
    import subprocess
    import time

    inbox, out, report = tmp_path / "in", tmp_path / "out", tmp_path / "report.json"
    inbox.mkdir()
    for i in range(12):
        shutil.copy(sample_paths["biden"], inbox / f"b{i:02d}.jpg")
    proc = subprocess.Popen(_cli(str(sample_paths["obama"]), "--targets", str(inbox),
                                 "--out-dir", str(out), "--json-report", str(report)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (out.is_dir() and any(p.suffix == ".jpg" for p in out.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    body = json.loads(report.read_text())
    assert body["interrupted"] is True
    assert 1 <= body["counts"]["done"] < 12
    assert body["counts"]["done"] + body["counts"]["not_started"] == 12
    assert "not started" in stdout
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(Path(p).name for p in body["done"])  # no temporaries
    for name in written:
        assert decode_image(out / name).size > 0


def test_second_ctrl_c_stops_now_and_leaves_no_temporary(sample_paths, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import signal
    import subprocess
    import time

    import cv2

    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    # Large targets (2048 px, PNG out): the images in flight take long enough to
    # encode that the second Ctrl-C lands while they are written, not after the
    # batch has finished them.
    big = np.asarray(cv2.resize(decode_image(sample_paths["astronaut"]), (2048, 2048),
                                interpolation=cv2.INTER_CUBIC), np.uint8)
    data = encode_image(big, "png")
    for i in range(12):
        (inbox / f"a{i:02d}.png").write_bytes(data)
    proc = subprocess.Popen(_cli(str(sample_paths["obama"]), "--targets", str(inbox),
                                 "--out-dir", str(out), "--format", "png", "--jobs", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (out.is_dir() and any(out.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "stopped now" in stderr
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert len(list(out.iterdir())) < 12


def test_an_unwritable_output_is_recorded_and_the_batch_goes_on(
        sample_paths: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "blocked").write_text("a file where a directory is needed")
    shutil.copy(sample_paths["biden"], tmp_path / "biden.jpg")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(f"{sample_paths['obama']},biden.jpg,blocked/x.jpg\n"
                     f"{sample_paths['obama']},biden.jpg,fine.jpg\n")
    report = tmp_path / "r.json"
    rc = cli_main(["fuse", "--pairs", str(pairs), "--out-dir", str(out), "--json-report",
                   str(report), "--no-progress"])
    assert rc == 1
    body = json.loads(report.read_text())
    assert [Path(p).name for p in body["done"]] == ["fine.jpg"]
    assert [f["code"] for f in body["failed"]] == ["file_error"]


@pytest.mark.parametrize("output", ["../../escaped.jpg", "{tmp}/escaped-absolute.jpg"])
def test_csv_outputs_stay_under_the_out_dir(output: str, sample_paths: dict[str, Path],
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    output = output.format(tmp=tmp_path)
    out = tmp_path / "a" / "out"
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(f"{sample_paths['obama']},{sample_paths['biden']},{output}\n")
    rc = cli_main(["fuse", "--pairs", str(pairs), "--out-dir", str(out), "--no-progress"])
    assert rc == 2
    assert "output_outside_out_dir" in capsys.readouterr().err
    assert not (out / output).resolve().exists()
    if output.startswith("/"):
        return
    rc = cli_main(["fuse", "--pairs", str(pairs), "--out-dir", str(out), "--no-progress",
                   "--allow-outside-out-dir"])
    assert rc == 0 and (out / output).resolve().is_file()


def test_outputs_follow_the_umask_and_a_broken_leftover_is_redone(
        sample_paths: dict[str, Path], tmp_path: Path) -> None:
    import os

    inbox, out, report = tmp_path / "in", tmp_path / "out", tmp_path / "r.json"
    inbox.mkdir()
    shutil.copy(sample_paths["biden"], inbox / "biden.jpg")
    shutil.copy(sample_paths["obama2"], inbox / "obama2.jpg")
    out.mkdir()
    (out / "biden.jpg").touch()  # a leftover of a run killed mid-way
    (out / "obama2.jpg").write_bytes(sample_paths["obama2"].read_bytes()[:5000])  # cut short
    old = os.umask(0o027)
    try:
        rc = cli_main(["fuse", str(sample_paths["obama"]), "--targets", str(inbox),
                       "--out-dir", str(out), "--json-report", str(report), "--no-progress"])
    finally:
        os.umask(old)
    assert rc == 0
    body = json.loads(report.read_text())
    assert body["counts"]["done"] == 2 and body["counts"]["skipped"] == 0
    assert sorted(Path(p).name for p in body["redone"]) == ["biden.jpg", "obama2.jpg"]
    for name in ("biden.jpg", "obama2.jpg"):
        assert decode_image(out / name).size > 0
        assert (out / name).stat().st_mode & 0o777 == 0o640
