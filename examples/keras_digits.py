"""Horovod Keras training (`model.fit`) of a small CNN on scikit-learn's digits, with gTop-k as
one option, on Keras 3 (TensorFlow's default) or tf-keras (TF_USE_LEGACY_KERAS=1).

A plain Horovod Keras script (hvd.init, a shard of the data per worker, a distributed optimizer,
a callback that broadcasts the initial variables) in which the optimizer comes from
gtopk_hvd.tensorflow.keras: Compression.gtopk / .topk for sparsified gradients, Compression.none
/ .fp16 for Horovod's dense allreduce (horovod.tensorflow.keras itself does not run on Keras 3).
The data (1797 8x8 images, 10 classes) ships with scikit-learn: nothing is downloaded.

    mpirun --allow-run-as-root --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \\
        .venv/bin/python examples/keras_digits.py --compression gtopk --density 0.01

Rank 0 ends with a machine-readable RESULT line and every rank with a CHECKSUM line of its
variables, so that the replicas can be checked to be bitwise identical (see digits_common).
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

import digits_common
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from sparse_options import SPARSE

import gtopk_hvd.tensorflow.keras as gtopk

keras = tf.keras  # Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    digits_common.add_common_arguments(
        parser, compression="gradient compression (none/fp16: dense; topk/gtopk: sparsified)")
    parser.add_argument("--backward-passes-per-step", type=int, default=1,
                        help="batches whose gradients are summed locally before each step")
    args = parser.parse_args(argv)
    digits_common.check_common_arguments(parser, args)
    if args.backward_passes_per_step < 1:
        parser.error("--backward-passes-per-step must be at least 1")
    return args


def build_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def distributed_optimizer(args: argparse.Namespace, optimizer: Any) -> Any:
    """The one place that differs from a single-worker Keras script."""
    if args.compression in digits_common.DENSE:
        compression = getattr(gtopk.Compression, args.compression)
    else:
        compression = SPARSE[args.compression](density=args.density)
    return gtopk.DistributedOptimizer(optimizer, compression=compression,
                                      backward_passes_per_step=args.backward_passes_per_step)


def main() -> None:
    args = parse_args()
    hvd.init()
    rank, workers = hvd.rank(), hvd.size()
    x_train, y_train, x_test, y_test = digits_common.load_digits_split()
    mine = digits_common.shard(len(x_train), args.seed, rank, workers)

    model = build_model(args.seed)
    optimizer = distributed_optimizer(
        args, keras.optimizers.SGD(args.lr * workers, momentum=args.momentum))
    model.compile(optimizer=optimizer, jit_compile=False, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x_train[mine], y_train[mine], batch_size=args.batch_size, epochs=args.epochs,
              shuffle=True, verbose=2 if rank == 0 else 0,
              validation_data=(x_test, y_test) if rank == 0 else None,
              callbacks=[gtopk.BroadcastGlobalVariablesCallback(root_rank=0)])

    test_loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    sent, density = digits_common.communication(args.compression, args.density,
                                                optimizer.last_stats, params, workers)
    # rank 0's epoch lines are printed before any rank's results
    hvd.allreduce(tf.zeros([]), name="barrier")
    if rank == 0:
        digits_common.emit(digits_common.result_line(
            compression=args.compression, density=density, workers=workers, epochs=args.epochs,
            test_accuracy=accuracy, test_loss=test_loss, bytes_per_step=sent, params=params))
    checksum = digits_common.sha256_hex(variable.numpy() for variable in model.variables)
    digits_common.emit(digits_common.checksum_line(rank, checksum))


if __name__ == "__main__":
    main()
