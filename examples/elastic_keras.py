"""Elastic Horovod with Keras' model.fit and a sparse optimizer: training goes on when a worker
dies or comes back (Keras 3; tf-keras with TF_USE_LEGACY_KERAS=1).

    horovodrun --gloo -np 4 --min-np 3 --max-np 4 --host-discovery-script ./hosts.sh \\
        python examples/elastic_keras.py --compression gtopk --density 0.05 --steps 60

The regression of examples/elastic_torch.py, each step's global batch split over the current
workers. Horovod's elastic Keras recipe with gtopk_hvd's `KerasState` in place of
`hvd.elastic.KerasState` (which fails on Keras 3 and does not hold the residual): every step
commits the weights, the optimizer's variables and this worker's residual
(`gtopk_hvd.tensorflow.keras.elastic`); on a reset the survivors restore the last commit, the
weights and optimizer variables are synced from rank 0, a new worker starts from zero residual,
and the sparse step is rebuilt for the new number of workers at its next step. `model.fit`
runs once per attempt, from the committed step on (`state.step`).

--kill-rank R --kill-at S (fault injection): the worker started as rank R kills itself with
SIGKILL at step S, once (the marker file remembers it): with --kill-phase reduction (the
default) as its batch begins, so the others are inside the sparse step when it dies; with
commit instead of its commit, so the others are inside theirs. Rank 0 prints a line per step
(size, loss) and at the end the seconds from the kill to the first step completed after it and a
RESULT line with the final loss and the weights' checksum, which every worker checks is the same.
"""

from __future__ import annotations

import argparse
import os
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from elastic_common import (
    FEATURES,
    RecoveryClock,
    add_kill_options,
    add_training_options,
    arrays,
    die,
    digest,
    step_rows,
)

import gtopk_hvd.tensorflow.keras as gtopk
from gtopk_hvd.tensorflow.keras import elastic


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_options(parser, steps=60, marker="/tmp/gtopk_elastic_keras_killed")
    add_kill_options(parser)
    return parser.parse_args()


class Steps(tf.keras.callbacks.Callback):
    """Counts the job's steps in `state.step`, commits after each, injects the fault and notes
    the recovery time."""

    def __init__(self, state: elastic.KerasState, args: argparse.Namespace,
                 started_as: int, clock: RecoveryClock) -> None:
        super().__init__()
        self.state, self.args, self.started_as, self.clock = state, args, started_as, clock

    def dying(self, phase: str) -> bool:
        return (self.started_as == self.args.kill_rank and self.state.step == self.args.kill_at
                and self.args.kill_phase == phase and not self.args.marker.exists())

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        time.sleep(self.args.compute_ms / 1e3)
        if self.dying("reduction"):
            die(self.args.marker)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        size = hvd.size()
        self.state.step += 1
        self.clock.step_done(size)
        if hvd.rank() == 0:
            print(f"step {self.state.step} size {size} loss {logs['loss']:.5f}", flush=True)
        if self.dying("commit"):
            die(self.args.marker)
        self.state.commit()


def main() -> None:
    args = parse_args()
    hvd.init()
    started_as = int(os.environ.get("HOROVOD_RANK", hvd.rank()))  # the spawn rank, kept
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                 tf.keras.layers.Dense(64, activation="tanh"),
                                 tf.keras.layers.Dense(1)])
    compression = (gtopk.Compression.none if args.compression == "none"
                   else getattr(gtopk.Compression, args.compression)(args.density))
    optimizer = gtopk.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr),
                                           compression=compression)
    model.compile(optimizer=optimizer, loss="mse")
    x, y = arrays()
    state = elastic.KerasState(model, step=0)
    clock = RecoveryClock(args.marker)

    def batches(start: int):
        rank, size = hvd.rank(), hvd.size()
        for step in range(start, args.steps):
            mine = step_rows(step, args.batch, rank, size)
            yield x[mine], y[mine]

    @elastic.run
    def train(state: elastic.KerasState) -> None:
        if state.step >= args.steps:
            return
        data = tf.data.Dataset.from_generator(
            lambda: batches(state.step),
            output_signature=(tf.TensorSpec((None, FEATURES), tf.float32),
                              tf.TensorSpec((None, 1), tf.float32)))
        model.fit(data, steps_per_epoch=args.steps - state.step, epochs=1, verbose=0,
                  callbacks=[Steps(state, args, started_as, clock)])

    train(state)
    final = float(np.mean((model.predict(x, verbose=0) - y) ** 2))
    sums = hvd.allgather_object(digest(w.numpy() for w in model.trainable_weights))
    assert len(set(sums)) == 1, f"replicas differ: {sums}"
    if clock.seconds is not None:
        print(f"RECOVERY rank={hvd.rank()} seconds={clock.seconds:.2f}", flush=True)
    if hvd.rank() == 0:
        keras = "tf-keras" if type(model).__module__.startswith("tf_keras") else "keras3"
        print(f"RESULT elastic keras={keras} compression={args.compression} workers={hvd.size()} "
              f"steps={args.steps} loss={final:.6f} checksum={sums[0]}", flush=True)


if __name__ == "__main__":
    main()
