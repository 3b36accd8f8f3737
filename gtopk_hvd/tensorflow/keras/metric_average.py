"""`MetricAverageCallback`: the epoch's logs averaged over the workers, for Keras 3 and tf-keras
(Horovod 0.28's calls `keras.backend` functions that Keras 3 does not have)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf


def _numeric(value: Any) -> bool:
    try:
        return np.asarray(value).dtype.kind in "biuf"
    except (TypeError, ValueError):
        return False


def average_logs(logs: dict[str, Any]) -> None:
    """Replaces every numeric entry of `logs` (scalars or arrays) by its mean over the workers,
    in place. Every worker must call it, with the same names and shapes: these are compared
    first (one all-gather), and if any worker differs every worker raises RuntimeError. Then the
    values, in sorted name order, go through one hvd.allreduce (Average, float64)."""
    import horovod.tensorflow as hvd

    names = sorted(name for name, value in logs.items() if _numeric(value))
    arrays = [np.asarray(logs[name], dtype=np.float64) for name in names]
    signature = [(name, array.shape) for name, array in zip(names, arrays)]
    everyone = hvd.allgather_object(signature, name="gtopk_hvd_metric_names")
    if any(other != signature for other in everyone):
        listed = "; ".join(f"rank {rank}: {[n for n, _ in s]}" for rank, s in enumerate(everyone))
        raise RuntimeError("MetricAverageCallback: the workers' logs differ in names or shapes "
                           f"({listed}); every worker must log the same metrics")
    if not names:
        return
    flat = np.concatenate([array.reshape(-1) for array in arrays])
    mean = hvd.allreduce(tf.constant(flat), op=hvd.Average,
                         name="gtopk_hvd_metric_average").numpy()
    start = 0
    for name, array in zip(names, arrays):
        piece = mean[start:start + array.size].reshape(array.shape)
        start += array.size
        logs[name] = float(piece) if array.ndim == 0 else piece


class MetricAverageCallback(tf.keras.callbacks.Callback):
    """Horovod's callback of that name: the epoch's logs averaged over the workers.

    At the end of each epoch, every numeric entry of the logs (loss, metrics, validation
    metrics) becomes its mean over the workers, in place (`average_logs`), so that the callbacks
    after it (ReduceLROnPlateau, EarlyStopping, TensorBoard, History) see the averages: put it
    before them.

    Args:
        device: Horovod's, accepted and not used.

    Raises:
        RuntimeError: at the end of an epoch, on every worker, if their logs hold different
            names or shapes.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        del device

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        average_logs(logs if logs is not None else {})  # the same collectives on every worker
