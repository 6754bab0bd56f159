"""Warming model sessions at the batch sizes they will serve."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np

from facefuse.runtime.manifest import ModelSpec


class Runnable(Protocol):
    """A model with a manifest entry and a positional ``run``."""

    @property
    def spec(self) -> ModelSpec: ...

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]: ...


def warm_up(model: Runnable, batch_sizes: Iterable[int]) -> list[int]:
    """Run ``model`` once on zeros at each batch size its inputs allow.

    A fixed batch axis is warmed at its own size only. Returns the sizes run.
    """
    inputs = model.spec.inputs
    fixed = {int(t.shape[0]) for t in inputs if not isinstance(t.shape[0], str)}
    sizes = sorted(fixed) if fixed else sorted(set(batch_sizes))
    for n in sizes:
        feeds = [np.zeros([n, *(1 if isinstance(d, str) else int(d) for d in t.shape[1:])],
                          np.dtype(t.dtype)) for t in inputs]
        model.run(*feeds)
    return sizes
