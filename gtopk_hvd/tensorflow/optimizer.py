"""gtopk_hvd.tensorflow.DistributedOptimizer: Horovod's TensorFlow entry point for optimizers.

In TensorFlow 2, horovod.tensorflow.DistributedOptimizer hands Keras optimizers to its Keras
wrapper; this does the same with gtopk_hvd.tensorflow.keras.DistributedOptimizer. TF1-style
`tf.compat.v1.train.Optimizer`s (graph mode with sessions) are not supported: use a Keras
optimizer, or DistributedGradientTape with any optimizer.
"""

from __future__ import annotations

from typing import Any

from gtopk_hvd.compression import Compression


def DistributedOptimizer(  # noqa: N802 - Horovod's name
        optimizer: Any, name: str | None = None, use_locking: bool = False,
        device_dense: str = "", device_sparse: str = "", compression: Any = Compression.none,
        sparse_as_dense: bool = False, backward_passes_per_step: int = 1, op: Any = None,
        gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
        num_groups: int = 0, groups: Any = None, process_set: Any = None) -> Any:
    """horovod.tensorflow.DistributedOptimizer with gtopk_hvd's Compression choices.

    As Horovod's in TensorFlow 2, a Keras optimizer goes to the Keras wrapper,
    `gtopk_hvd.tensorflow.keras.DistributedOptimizer`, with the other arguments (module
    docstring).

    Args:
        optimizer: a Keras optimizer (tf.keras.optimizers.*, Keras 3 or tf-keras); TF1-style
            tf.compat.v1.train optimizers are refused.
        name: Horovod's, accepted and not used.
        use_locking: Horovod's, for TF1 optimizers: not used.
        device_dense, device_sparse, compression, sparse_as_dense, backward_passes_per_step,
            op, gradient_predivide_factor, average_aggregated_gradients, num_groups, groups,
            process_set: passed to `gtopk_hvd.tensorflow.keras.DistributedOptimizer`, which
            says what each does and allows.

    Returns:
        What `gtopk_hvd.tensorflow.keras.DistributedOptimizer` returns for these arguments: a
        subclass of the optimizer's class whose apply_gradients reduces the gradients first
        (on tf-keras with a dense compression, Horovod's own Keras wrapper).

    Raises:
        NotImplementedError: a tf.compat.v1.train optimizer; also as the Keras wrapper
            raises it.
        ValueError: as the Keras wrapper raises it (an argument out of range or of the wrong
            type).
    """
    import tensorflow as tf

    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise NotImplementedError(
            "gtopk_hvd supports Keras optimizers (tf.keras.optimizers.*) and "
            "DistributedGradientTape; tf.compat.v1.train optimizers are not supported")
    from gtopk_hvd.tensorflow.keras import DistributedOptimizer as keras_distributed_optimizer

    return keras_distributed_optimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=groups, process_set=process_set)
