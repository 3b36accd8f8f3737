"""Uneven data with `hvd.join()` and the TensorFlow adapters (tests/core/test_join.py), under mpirun
(the MPI transport) or horovodrun --gloo (Horovod's collectives):

    python join_uneven_tf.py SCHEME keras|tape STEPS_OF_RANK_0 STEPS_OF_RANK_1 ...

Rank r takes STEPS_OF_RANK_r steps of a D-value variable whose gradient at step t is drawn from
(r, t) (as in join_uneven.py), with the Keras optimizer that Horovod's own
`horovod.tensorflow.keras.DistributedOptimizer` builds (SGD, lr 1) or with
`DistributedGradientTape` (loss = sum(w * g), update w -= gradient), then calls Horovod's own
`hvd.join()`. The checks of join_uneven.py (`check`: returned rank, Top-k against the numpy
replay, replicas of the ranks that ran every step bitwise equal, the joined worker's weights
unmoved), then a broadcast from the returned rank makes every replica bitwise identical.
Prints "JOIN OK rank=<r> last=<rank>".
"""

from __future__ import annotations

import sys

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import tensorflow as tf
from harness import run_on_all_ranks
from join_uneven import DENSITY, D, check, gradient

import gtopk_hvd.tensorflow.keras as gtopk


def main() -> None:
    scheme, mode, steps = sys.argv[1], sys.argv[2], [int(n) for n in sys.argv[3:]]
    hvd.init()
    rank = hvd.rank()
    assert hvd.size() == len(steps), (hvd.size(), steps)
    compression = {"topk": gtopk.Compression.topk, "gtopk": gtopk.Compression.gtopk}[scheme]
    weights = tf.Variable(tf.zeros(D), name="weights")
    if mode == "keras":
        optimizer = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(1.0),
                                                   compression=compression(DENSITY))
        for t in range(steps[rank]):
            optimizer.apply_gradients([(tf.constant(gradient(rank, t)), weights)])
    else:
        state = gtopk.GTopkState()
        for t in range(steps[rank]):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(weights * tf.constant(gradient(rank, t)))
            tape = hvd.DistributedGradientTape(tape, compression=compression(DENSITY),
                                               gtopk_state=state)
            weights.assign_sub(tape.gradient(loss, [weights])[0])
    own = weights.numpy().copy()
    last = int(hvd.join())
    check(scheme, steps, rank, last, weights.numpy(), own,
          lambda x: hvd.allgather(tf.constant(x[None])).numpy())
    finished = hvd.allgather(tf.constant(own[None])).numpy()
    weights.assign(hvd.broadcast(weights, root_rank=last, name="join_broadcast"))
    replicas = hvd.allgather(tf.constant(weights.numpy()[None])).numpy()
    assert all(np.array_equal(replica, replicas[0]) for replica in replicas), "not identical"
    assert np.array_equal(replicas[0], finished[last])
    print(f"JOIN OK rank={rank} last={last}", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
