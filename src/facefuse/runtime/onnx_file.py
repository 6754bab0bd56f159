"""Reading one tensor out of an ONNX file without the ``onnx`` package."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np

from facefuse.errors import ModelCorruptError

_ONNX_DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype("<f4"), 10: np.dtype("<f2"), 11: np.dtype("<f8")}


def _varint(buf: Any, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("bad varint")


def _fields(buf: Any, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """Protobuf fields in ``buf[start:end]`` as ``(number, wire_type, value_or_start, end)``:
    varints and fixed-width values give ``(value, -1)``, length-delimited ``(start, end)``."""
    out: list[tuple[int, int, int, int]] = []
    i = start
    while i < end:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((number, wire, value, -1))
        elif wire == 2:
            length, i = _varint(buf, i)
            if i + length > end:
                raise ValueError("truncated field")
            out.append((number, wire, i, i + length))
            i += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            out.append((number, wire, int.from_bytes(bytes(buf[i:i + width]), "little"), -1))
            i += width
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if i != end:
        raise ValueError("truncated message")
    return out


def _tensor(blob: bytes) -> np.ndarray:
    """Decode a serialized ``onnx.TensorProto`` (dims, data_type, float/double/raw data)."""
    dims: list[int] = []
    dtype_code = 0
    raw: bytes | None = None
    floats: list[float] = []
    doubles: list[float] = []
    int32s: list[int] = []  # float16 values as uint16 bit patterns
    for number, wire, a, b in _fields(blob, 0, len(blob)):
        if number == 1:  # dims: packed or not
            if wire == 2:
                j = a
                while j < b:
                    v, j = _varint(blob, j)
                    dims.append(v)
            else:
                dims.append(a)
        elif number == 2:
            dtype_code = a
        elif number == 4 and wire == 2:  # float_data, packed
            floats.extend(np.frombuffer(blob[a:b], "<f4").tolist())
        elif number == 4 and wire == 5:
            floats.append(float(np.frombuffer(a.to_bytes(4, "little"), "<f4")[0]))
        elif number == 5 and wire == 2:  # int32_data, packed
            j = a
            while j < b:
                v, j = _varint(blob, j)
                int32s.append(v)
        elif number == 5 and wire == 0:
            int32s.append(a)
        elif number == 10 and wire == 2:  # double_data, packed
            doubles.extend(np.frombuffer(blob[a:b], "<f8").tolist())
        elif number == 9:
            raw = blob[a:b]
        elif number == 14 and a == 1:
            raise ValueError("the tensor's data is stored outside the model file")
    if dtype_code not in _ONNX_DTYPES:
        raise ValueError(f"unsupported initializer data type {dtype_code}")
    dtype = _ONNX_DTYPES[dtype_code]
    if raw is not None:
        arr = np.frombuffer(raw, dtype).astype(np.float32)
    elif dtype_code == 11:
        arr = np.asarray(doubles, np.float32)
    elif dtype_code == 10:
        arr = np.asarray(int32s, np.uint16).view(np.float16).astype(np.float32)
    else:
        arr = np.asarray(floats, np.float32)
    count = int(np.prod(dims)) if dims else 1
    if arr.size != count:
        raise ValueError(f"initializer has {arr.size} values for dims {dims}")
    out: np.ndarray = arr.reshape(dims)
    return out


def last_initializer(path: Path) -> np.ndarray:
    """The last graph initializer of an ONNX file as float32 (e.g. inswapper's ``emap``).

    A minimal protobuf reader (ModelProto.graph = 7, GraphProto.initializer = 5),
    so the ``onnx`` package is not needed at run time; the file is memory-mapped
    and only the graph's field headers and the one tensor are read.

    Raises:
        ModelCorruptError: the file cannot be parsed or has no such initializer.
    """
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            last: tuple[int, int] | None = None
            for number, wire, a, b in _fields(mm, 0, len(mm)):
                if number == 7 and wire == 2:  # graph
                    for gnum, gwire, ga, gb in _fields(mm, a, b):
                        if gnum == 5 and gwire == 2:
                            last = (ga, gb)
            if last is None:
                raise ValueError("the graph has no initializers")
            blob = mm[last[0]:last[1]]
        return _tensor(blob)
    except (ValueError, IndexError, OSError) as exc:
        raise ModelCorruptError(f"cannot read the last initializer of {path}: {exc}",
                                code="swap_contract") from exc
