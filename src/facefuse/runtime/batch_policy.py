"""How big model batches get and how long an item waits for company.

On the CPU a batch of 8 costs nearly 8 single runs (measured: micro-batching
gains about 4 %), so batches form only from the items that arrive while every
inference thread is busy (``max_queue_delay_ms`` 0, ``max_batch_size`` 8). On a
GPU a batch of 32 costs little more than one item, so a short wait that fills
the batch pays: the GPU policy takes ``gpu_max_batch_size`` and
``gpu_max_queue_delay_ms`` instead. The model sessions are warmed (and
TensorRT's shape profile built) at the sizes :meth:`BatchPolicy.warm_sizes` gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from facefuse.config import Settings

#: The batch size a loaded server sees most: TensorRT's "opt" profile and a warm-up size.
TYPICAL_BATCH = 8


@dataclass(frozen=True)
class BatchPolicy:
    """The micro-batcher knobs in force (Triton's names)."""

    max_batch_size: int
    max_queue_delay_ms: float
    device: str

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)

    def warm_sizes(self, batching: bool = True) -> tuple[int, ...]:
        """The batch sizes to warm the model sessions at before serving.

        On a GPU every size the batcher forms (:func:`warm_batch_sizes`): a new shape
        may build kernels or a TensorRT engine. On the CPU batch 1 only: there the
        first run of a shape costs ONNX Runtime 0-12 ms more than the next, and batch
        8 none measurably, while running every model at batch 8 adds ~0.3-0.6 s to
        the start-up on two cores (``warm_up`` per model, shared machine).
        """
        if self.device == "cpu":
            return (1,)
        return warm_batch_sizes(self.max_batch_size if batching else 1)


def batch_policy(settings: Settings, gpu: bool) -> BatchPolicy:
    """The CPU knobs (``max_batch_size``, ``max_queue_delay_ms``) or, when the
    models run on a GPU, the GPU ones (``gpu_max_batch_size``, ``gpu_max_queue_delay_ms``)."""
    if gpu:
        return BatchPolicy(settings.gpu_max_batch_size, settings.gpu_max_queue_delay_ms, "gpu")
    return BatchPolicy(settings.max_batch_size, settings.max_queue_delay_ms, "cpu")


def warm_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """1, :data:`TYPICAL_BATCH` and ``max_batch_size``, each at most ``max_batch_size``,
    ascending and without repeats."""
    top = max(1, max_batch_size)
    return tuple(sorted({1, min(TYPICAL_BATCH, top), top}))
