"""Strip the symbol tables of the compiled modules inside wheels, rewriting them in place.

Run on the build host by scripts/build-image.sh over the image's dependency wheels
(the image's base has no binutils). Extension modules (``*.so`` of numpy, Pillow,
uvloop, PyYAML, httptools...) often ship with their full symbol table; ``strip
--strip-unneeded`` keeps the dynamic symbols they are loaded by and drops the rest
(uvloop's loop module 13.6 → 1.6 MB; ~19 MB over the image's wheels).

Never touched: the libraries auditwheel grafted into a wheel (``<dist>.libs/``).
patchelf rewrote their layout, and ``strip`` on them yields files the loader refuses
(numpy's OpenBLAS: "ELF load command address/offset not page-aligned").

Each changed member's line in the wheel's ``RECORD`` gets its new sha256 and size, so
the wheel stays valid for pip. Member order, timestamps and modes are kept, so an
unchanged input gives the same output (podman's layer cache still hits).

    python3 deploy/strip-wheels.py [--strip strip] WHEEL...
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile

ELF_MAGIC = b"\x7fELF"


def record_hash(data: bytes) -> str:
    """The ``RECORD`` hash field of ``data`` (PEP 376 / the wheel spec)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def strippable(name: str, data: bytes) -> bool:
    """An ELF member outside the auditwheel-grafted ``*.libs/`` folders."""
    top = name.split("/", 1)[0]
    return data[:4] == ELF_MAGIC and not top.endswith(".libs")


def stripped(data: bytes, strip: str) -> bytes:
    """``data`` after ``strip --strip-unneeded`` (through a temporary file)."""
    fd, path = tempfile.mkstemp(suffix=".so")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        subprocess.run([strip, "--strip-unneeded", path], check=True)
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)


def strip_wheel(path: str, strip: str = "strip") -> int:
    """Strip ``path``'s extension modules in place; returns the bytes saved."""
    with zipfile.ZipFile(path) as zin:
        infos = zin.infolist()
        data = {i.filename: zin.read(i) for i in infos}
    changed: dict[str, bytes] = {}
    for name, blob in data.items():
        if strippable(name, blob):
            new = stripped(blob, strip)
            if len(new) < len(blob):
                changed[name] = new
    if not changed:
        return 0
    record = next(n for n in data if n.endswith(".dist-info/RECORD"))
    rows = list(csv.reader(io.StringIO(data[record].decode("utf-8"))))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        if row and row[0] in changed:
            row = [row[0], record_hash(changed[row[0]]), str(len(changed[row[0]]))]
        writer.writerow(row)
    changed[record] = out.getvalue().encode("utf-8")
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w") as zout:
        for info in infos:
            zout.writestr(info, changed.get(info.filename, data[info.filename]),
                          compress_type=info.compress_type)
    os.replace(tmp, path)
    return sum(len(data[n]) - len(b) for n, b in changed.items() if n != record)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheels", nargs="+")
    ap.add_argument("--strip", default="strip", help="the strip program (binutils)")
    args = ap.parse_args()
    total = 0
    for wheel in args.wheels:
        saved = strip_wheel(wheel, args.strip)
        if saved:
            print(f"strip-wheels: {os.path.basename(wheel)}: -{saved / 2**20:.1f} MiB",
                  file=sys.stderr)
        total += saved
    print(f"strip-wheels: {total / 2**20:.1f} MiB saved over {len(args.wheels)} wheels",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
