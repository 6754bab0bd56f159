"""deploy/strip-wheels.py: extension modules lose their symbol tables, grafted libraries
are left alone, and the rewritten wheel's RECORD matches its members."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import shutil
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "strip-wheels.py"


@pytest.fixture(scope="module")
def strip_wheels() -> ModuleType:
    if shutil.which("strip") is None:
        pytest.fail("strip (binutils) is missing: bash scripts/install-system-deps.sh")
    spec = importlib.util.spec_from_file_location("strip_wheels", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unstripped_module() -> bytes:
    """A real extension module that numpy ships with its symbol table."""
    core = Path(np.__file__).parent / "_core"
    path = next(core.glob("_multiarray_tests.*.so"))
    return path.read_bytes()


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def _wheel(path: Path, members: dict[str, bytes]) -> None:
    record = "demo-1.0.dist-info/RECORD"
    lines = [f"{name},{_hash(data)},{len(data)}" for name, data in members.items()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")


def test_modules_are_stripped_grafted_libraries_kept_and_record_updated(
        strip_wheels: ModuleType, tmp_path: Path) -> None:
    elf = _unstripped_module()
    members = {"demo/_ext.so": elf, "demo.libs/libgrafted.so": elf,
               "demo/__init__.py": b"x = 1\n"}
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    _wheel(wheel, members)
    saved = strip_wheels.strip_wheel(str(wheel))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        out = {n: z.read(n) for n in names}
    assert names == [*members, "demo-1.0.dist-info/RECORD"]  # order kept
    assert 0 < len(out["demo/_ext.so"]) < len(elf)
    assert saved == len(elf) - len(out["demo/_ext.so"])
    assert out["demo/_ext.so"][:4] == b"\x7fELF"
    assert out["demo.libs/libgrafted.so"] == elf
    assert out["demo/__init__.py"] == members["demo/__init__.py"]
    rows = {r[0]: r[1:] for r in csv.reader(io.StringIO(out["demo-1.0.dist-info/RECORD"]
                                                         .decode()))}
    for name in members:
        assert rows[name] == [_hash(out[name]), str(len(out[name]))]
    # A second pass finds nothing left to strip and leaves the file as it is.
    before = wheel.read_bytes()
    assert strip_wheels.strip_wheel(str(wheel)) == 0
    assert wheel.read_bytes() == before
