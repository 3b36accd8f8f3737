"""Horovod TensorFlow 2 training (custom loop) of a small CNN on scikit-learn's digits, with
gTop-k as one option.

A plain Horovod TF2 script (hvd.init, a shard of the data per worker, a tf.function train step
with a DistributedGradientTape, broadcast of the initial variables) in which one call,
`distributed_tape`, picks the tape: Horovod's own for --compression none/fp16, gtopk_hvd's for
topk/gtopk. The data (1797 8x8 images, 10 classes) ships with scikit-learn: nothing is
downloaded.

    mpirun --allow-run-as-root --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \\
        .venv/bin/python examples/tensorflow2_digits.py --compression gtopk --density 0.01

--checkpoint DIR saves, on every worker, model, optimizer, epoch count and that worker's
gTop-k residual to DIR/rank<r> (residuals differ between workers); --resume DIR continues from
there, exactly: 5 epochs then 5 resumed ones end bitwise where 10 epochs in one go do.

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
import os
import sys
from typing import Any, Optional

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from mpi4py import MPI  # loaded before hvd.init()
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

COMPRESSIONS = ("none", "fp16", "topk", "gtopk")
keras = tf.keras


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compression", choices=COMPRESSIONS, default="gtopk",
                        help="gradient compression (none/fp16: Horovod's; topk/gtopk: gtopk_hvd's)")
    parser.add_argument("--density", type=float, default=0.01,
                        help="fraction k/d of gradient entries sent (topk, gtopk)")
    parser.add_argument("--epochs", type=int, default=30,
                        help="train until this many passes over the training set in all")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per worker")
    parser.add_argument("--lr", type=float, default=0.02,
                        help="learning rate per worker (scaled by the number of workers)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--seed", type=int, default=42, help="seed of the model and the shards")
    parser.add_argument("--eager", action="store_true", help="no tf.function around the step")
    parser.add_argument("--checkpoint", metavar="DIR", default=None,
                        help="save every worker's state under DIR/rank<r> at the end")
    parser.add_argument("--resume", metavar="DIR", default=None,
                        help="continue from the state saved under DIR/rank<r>")
    args = parser.parse_args(argv)
    if not 0.0 < args.density <= 1.0:
        parser.error("--density must be in (0, 1]")
    return args


def load_data() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The digits, pixels scaled to [0, 1], split 80/20 the same way on every worker."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, random_state=0, stratify=labels)
    return (x_train, y_train), (x_test, y_test)


def shard(count: int, epoch: int, seed: int, rank: int, workers: int) -> np.ndarray:
    """This worker's sample indices for one epoch: one permutation shared by all workers,
    padded (by wrapping) to a multiple of the worker count, every workers-th from `rank`, so
    every worker runs the same number of steps (as torch's DistributedSampler does)."""
    order = np.random.default_rng(seed + epoch).permutation(count)
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


def distributed_tape(args: argparse.Namespace, tape: tf.GradientTape,
                     gtopk_state: Any) -> tf.GradientTape:
    """The one place that differs from a plain Horovod script."""
    if args.compression in ("none", "fp16"):
        return hvd.DistributedGradientTape(
            tape, compression=getattr(hvd.Compression, args.compression))
    import gtopk_hvd.tensorflow as gtopk

    factory = gtopk.Compression.gtopk if args.compression == "gtopk" else gtopk.Compression.topk
    return gtopk.DistributedGradientTape(tape, compression=factory(density=args.density),
                                         gtopk_state=gtopk_state)


def cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))


def broadcast(variables: list, root_rank: int = 0) -> None:
    """Every worker's variables set to rank 0's (works for Keras 3 variables)."""
    for position, variable in enumerate(variables):
        variable.assign(hvd.broadcast(tf.convert_to_tensor(variable), root_rank,
                                      name=f"broadcast_{position}"))


def evaluate(model: keras.Model, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean cross-entropy over the whole test set (same on every replica)."""
    logits = model(x, training=False)
    loss = float(cross_entropy(logits, y))
    accuracy = float(np.mean(np.argmax(logits.numpy(), axis=1) == y))
    return accuracy, loss


def communication(args: argparse.Namespace, gtopk_state: Any, params: int) -> tuple[int, float]:
    """Bytes each worker sent in the last step, and the density sent (see pytorch_digits)."""
    if args.compression not in ("none", "fp16"):
        stats = gtopk_state.last_stats if gtopk_state is not None else None
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

    model = build_model(args.seed)
    optimizer = keras.optimizers.SGD(args.lr * workers, momentum=args.momentum)
    optimizer.build(model.trainable_variables)
    gtopk_state = None
    if args.compression not in ("none", "fp16"):
        import gtopk_hvd.tensorflow as gtopk

        gtopk_state = gtopk.GTopkState()
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    saved = {"model": model, "optimizer": optimizer, "epoch": epoch}
    if gtopk_state is not None:
        saved["gtopk"] = gtopk_state
    checkpoint = tf.train.Checkpoint(**saved)
    if args.resume:
        checkpoint.read(os.path.join(args.resume, f"rank{rank}", "ckpt")).assert_consumed()
    else:
        broadcast(model.variables + list(optimizer.variables))

    def train_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = cross_entropy(model(images, training=True), labels)
        tape = distributed_tape(args, tape, gtopk_state)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    step = train_step if args.eager else tf.function(train_step)
    while int(epoch.numpy()) < args.epochs:
        indices = shard(len(x_train), int(epoch.numpy()), args.seed, rank, workers)
        losses = []
        for start in range(0, len(indices), args.batch_size):
            batch = indices[start:start + args.batch_size]
            losses.append(float(step(x_train[batch], y_train[batch])))
        epoch.assign_add(1)
        if rank == 0:
            accuracy, test_loss = evaluate(model, x_test, y_test)
            emit(f"epoch {int(epoch.numpy())}/{args.epochs} train_loss={np.mean(losses):.4f} "
                 f"test_loss={test_loss:.4f} test_accuracy={accuracy:.4f}")

    accuracy, test_loss = evaluate(model, x_test, y_test)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    sent, density = communication(args, gtopk_state, params)
    if args.checkpoint:
        checkpoint.write(os.path.join(args.checkpoint, f"rank{rank}", "ckpt"))
    MPI.COMM_WORLD.Barrier()  # every rank's epochs printed before the results
    if rank == 0:
        emit(f"RESULT compression={args.compression} density={density:g} "
             f"workers={workers} epochs={args.epochs} test_accuracy={accuracy:.4f} "
             f"test_loss={test_loss:.4f} bytes_per_step={sent} params={params}")
    emit(f"CHECKSUM rank={rank} {checksum(model.variables)}")


if __name__ == "__main__":
    main()
