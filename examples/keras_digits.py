"""Horovod Keras training (`model.fit`) of a small CNN on scikit-learn's digits, with gTop-k as
one option, on Keras 3 (TensorFlow's default) or tf-keras (TF_USE_LEGACY_KERAS=1).

A plain Horovod Keras script (hvd.init, a shard of the data per worker, a distributed optimizer,
a callback that broadcasts the initial variables) in which the optimizer comes from
gtopk_hvd.tensorflow.keras: Compression.gtopk / .topk for sparsified gradients, Compression.none
/ .fp16 for Horovod's dense allreduce (horovod.tensorflow.keras itself does not run on Keras 3).
The data (1797 8x8 images, 10 classes) ships with scikit-learn: nothing is downloaded.

    mpirun --allow-run-as-root --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \\
        .venv/bin/python examples/keras_digits.py --compression gtopk --density 0.01

Rank 0 ends with one machine-readable line,

    RESULT compression=.. density=.. workers=.. epochs=.. test_accuracy=.. test_loss=..
        bytes_per_step=.. params=..

(on one line), and every rank prints `CHECKSUM rank=<r> <sha256 of its variables>` so that the
replicas can be checked to be bitwise identical.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from typing import Any, Optional

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from mpi4py import MPI  # loaded before hvd.init()
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import gtopk_hvd.tensorflow.keras as gtopk

COMPRESSIONS = ("none", "fp16", "topk", "gtopk")
keras = tf.keras  # Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compression", choices=COMPRESSIONS, default="gtopk",
                        help="gradient compression (none/fp16: dense; topk/gtopk: sparsified)")
    parser.add_argument("--density", type=float, default=0.01,
                        help="fraction k/d of gradient entries sent (topk, gtopk)")
    parser.add_argument("--epochs", type=int, default=30, help="passes over the training set")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per worker")
    parser.add_argument("--lr", type=float, default=0.02,
                        help="learning rate per worker (scaled by the number of workers)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--seed", type=int, default=42, help="seed of the model and the shards")
    parser.add_argument("--backward-passes-per-step", type=int, default=1,
                        help="batches whose gradients are summed locally before each step")
    args = parser.parse_args(argv)
    if not 0.0 < args.density <= 1.0:
        parser.error("--density must be in (0, 1]")
    if args.backward_passes_per_step < 1:
        parser.error("--backward-passes-per-step must be at least 1")
    return args


def load_data() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The digits, pixels scaled to [0, 1], split 80/20 the same way on every worker."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, random_state=0, stratify=labels)
    return (x_train, y_train), (x_test, y_test)


def shard(count: int, seed: int, rank: int, workers: int) -> np.ndarray:
    """This worker's sample indices: one permutation shared by all workers, padded (by
    wrapping) to a multiple of the worker count, every workers-th from `rank`: every worker
    gets as many samples, hence runs as many steps per epoch."""
    order = np.random.default_rng(seed).permutation(count)
    total = math.ceil(count / workers) * workers
    order = np.concatenate([order, order[:total - count]])
    return order[rank::workers]


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
    compression = {"none": gtopk.Compression.none, "fp16": gtopk.Compression.fp16,
                   "topk": gtopk.Compression.topk(density=args.density),
                   "gtopk": gtopk.Compression.gtopk(density=args.density)}[args.compression]
    return gtopk.DistributedOptimizer(optimizer, compression=compression,
                                      backward_passes_per_step=args.backward_passes_per_step)


def communication(args: argparse.Namespace, optimizer: Any, params: int) -> tuple[int, float]:
    """Bytes each worker sent in the last step, and the density sent (see pytorch_digits)."""
    if args.compression not in ("none", "fp16"):
        stats = optimizer.last_stats
        if stats is None:
            return 0, args.density
        return int(stats.bytes_sent), float(stats.density)
    workers = hvd.size()
    value_bytes = 4 if args.compression == "none" else 2
    return int(2 * (workers - 1) / workers * value_bytes * params), 1.0


def checksum(variables: list) -> str:
    digest = hashlib.sha256()
    for variable in variables:
        digest.update(np.asarray(variable.numpy()).tobytes())
    return digest.hexdigest()


def emit(line: str) -> None:
    """Print a whole line in one write, so that lines from several ranks never run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    args = parse_args()
    hvd.init()
    rank, workers = hvd.rank(), hvd.size()
    (x_train, y_train), (x_test, y_test) = load_data()
    mine = shard(len(x_train), args.seed, rank, workers)

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
    sent, density = communication(args, optimizer, params)
    MPI.COMM_WORLD.Barrier()  # rank 0's epoch lines printed before any rank's results
    if rank == 0:
        emit(f"RESULT compression={args.compression} density={density:g} "
             f"workers={workers} epochs={args.epochs} test_accuracy={accuracy:.4f} "
             f"test_loss={test_loss:.4f} bytes_per_step={sent} params={params}")
    emit(f"CHECKSUM rank={rank} {checksum(model.variables)}")


if __name__ == "__main__":
    main()
