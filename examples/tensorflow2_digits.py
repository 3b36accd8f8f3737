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
there, exactly: 5 epochs then 5 resumed ones end bitwise where 10 epochs in one go do
(--checkpoint-at 5 saves after the 5th epoch of a longer run).

Rank 0 ends with a machine-readable RESULT line and every rank with a CHECKSUM line of its
variables, so that the replicas can be checked to be bitwise identical (see digits_common).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional

import digits_common
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from sparse_options import SPARSE

import gtopk_hvd.tensorflow as gtopk  # before hvd.init(): under mpirun it loads MPI first

keras = tf.keras


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    digits_common.add_common_arguments(
        parser, epochs="train until this many passes over the training set in all")
    parser.add_argument("--eager", action="store_true", help="no tf.function around the step")
    parser.add_argument("--checkpoint", metavar="DIR", default=None,
                        help="save every worker's state under DIR/rank<r> at the end (or "
                             "after --checkpoint-at epochs)")
    parser.add_argument("--checkpoint-at", metavar="EPOCH", type=int, default=None,
                        help="with --checkpoint: save after this epoch, then train on")
    parser.add_argument("--resume", metavar="DIR", default=None,
                        help="continue from the state saved under DIR/rank<r>")
    args = parser.parse_args(argv)
    digits_common.check_common_arguments(parser, args)
    if args.checkpoint_at is not None and (not args.checkpoint
                                           or not 0 < args.checkpoint_at <= args.epochs):
        parser.error("--checkpoint-at needs --checkpoint and an epoch in 1..--epochs")
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


def distributed_tape(args: argparse.Namespace, tape: tf.GradientTape,
                     gtopk_state: Any) -> tf.GradientTape:
    """The one place that differs from a plain Horovod script. Dense choices use gtopk_hvd's tape
    too: Horovod 0.28's own DistributedGradientTape fails on Keras 3 variables."""
    if args.compression in ("none", "fp16"):
        return gtopk.DistributedGradientTape(
            tape, compression=getattr(gtopk.Compression, args.compression))
    return gtopk.DistributedGradientTape(tape,
                                         compression=SPARSE[args.compression](args.density),
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


def main() -> None:
    args = parse_args()
    hvd.init()
    rank, workers = hvd.rank(), hvd.size()
    x_train, y_train, x_test, y_test = digits_common.load_digits_split()

    model = build_model(args.seed)
    optimizer = keras.optimizers.SGD(args.lr * workers, momentum=args.momentum)
    optimizer.build(model.trainable_variables)
    gtopk_state = None
    if args.compression not in ("none", "fp16"):
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
        # one permutation per epoch, shared by all workers: this worker's share of it
        indices = digits_common.shard(len(x_train), args.seed + int(epoch.numpy()), rank,
                                      workers)
        losses = []
        for start in range(0, len(indices), args.batch_size):
            batch = indices[start:start + args.batch_size]
            losses.append(float(step(x_train[batch], y_train[batch])))
        epoch.assign_add(1)
        if args.checkpoint and int(epoch.numpy()) == args.checkpoint_at:
            checkpoint.write(os.path.join(args.checkpoint, f"rank{rank}", "ckpt"))
        if rank == 0:
            accuracy, test_loss = evaluate(model, x_test, y_test)
            digits_common.emit(
                f"epoch {int(epoch.numpy())}/{args.epochs} train_loss={np.mean(losses):.4f} "
                f"test_loss={test_loss:.4f} test_accuracy={accuracy:.4f}")

    accuracy, test_loss = evaluate(model, x_test, y_test)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    stats = gtopk_state.last_stats if gtopk_state is not None else None
    sent, density = digits_common.communication(args.compression, args.density, stats, params,
                                                workers)
    if args.checkpoint and args.checkpoint_at is None:
        checkpoint.write(os.path.join(args.checkpoint, f"rank{rank}", "ckpt"))
    hvd.allreduce(tf.zeros([]), name="barrier")  # every rank's epochs printed before the results
    if rank == 0:
        digits_common.emit(digits_common.result_line(
            compression=args.compression, density=density, workers=workers, epochs=args.epochs,
            test_accuracy=accuracy, test_loss=test_loss, bytes_per_step=sent, params=params))
    checksum = digits_common.sha256_hex(variable.numpy() for variable in model.variables)
    digits_common.emit(digits_common.checksum_line(rank, checksum))


if __name__ == "__main__":
    main()
