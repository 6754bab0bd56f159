"""Small helpers our converters share to write ONNX graphs by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from facefuse.runtime.files import atomic_write_bytes


class GraphBuilder:
    """Accumulates ONNX nodes and initializers with fresh, deterministic names."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._count = 0

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        """A new initializer holding ``value``; returns its name."""
        from onnx import numpy_helper

        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], prefix: str, **attrs: Any) -> str:
        """A new node with one output; returns the output's name."""
        from onnx import helper

        out = self.fresh(prefix)
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out


def save_checked(model: Any, onnx_path: Path) -> None:
    """Check ``model`` fully (shapes included) and write it to ``onnx_path`` atomically."""
    import onnx

    onnx.checker.check_model(model, full_check=True)
    atomic_write_bytes(Path(onnx_path), model.SerializeToString(), mode=0o644)
