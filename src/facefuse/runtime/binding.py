"""Running a session through ONNX Runtime's IO binding.

With plain ``session.run`` every call hands ORT host arrays and gets host arrays
back, and ORT allocates the outputs anew. With IO binding the batch is copied to
the session's device once (one ``OrtValue`` per input), the outputs are
allocated on that device and copied back to the host once, after the whole
batch has run: on a GPU no intermediate host round trip, on the CPU the same
arithmetic as ``run`` (the tests compare both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort


def run_bound(
    session: ort.InferenceSession,
    input_names: Sequence[str],
    inputs: Sequence[np.ndarray],
    device: str = "cpu",
    device_id: int = 0,
) -> list[np.ndarray]:
    """Run ``session`` on ``inputs`` with IO binding on ``device`` (``cpu`` or ``cuda``).

    Args:
        session: an ORT session whose first provider runs on ``device``.
        input_names: the graph input names, in the order of ``inputs``.
        inputs: (N, ...) arrays of the input dtypes (made C-contiguous here).
        device: where inputs and outputs are bound.

    Returns:
        Every graph output as a host array, in graph order (as ``session.run(None, ...)``).
    """
    binding = session.io_binding()
    for name, x in zip(input_names, inputs, strict=True):
        arr = np.ascontiguousarray(x)
        if device == "cpu":
            binding.bind_cpu_input(name, arr)
        else:
            value = ort.OrtValue.ortvalue_from_numpy(arr, device, device_id)
            binding.bind_ortvalue_input(name, value)
    for out in session.get_outputs():
        binding.bind_output(out.name, device, device_id)
    session.run_with_iobinding(binding)
    outputs: list[Any] = binding.copy_outputs_to_cpu()
    return [np.asarray(o) for o in outputs]
