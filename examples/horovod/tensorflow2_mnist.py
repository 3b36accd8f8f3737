# ruff: noqa: ANN001, ANN201, UP008, UP031, UP032 - Horovod's code kept as upstream wrote it
# Trimmed copy of horovod/examples/tensorflow2/tensorflow2_mnist.py at v0.28.1,
# Copyright Horovod authors, Apache-2.0 (see tests/horovod_upstream/LICENSE).
# Changes:
#   (a) scikit-learn's digits (8x8, upscaled to MNIST's 28x28 by np.kron and a pad) instead of
#       tf.keras.datasets.mnist (no download); batches of 32 instead of 128 and
#       160 // hvd.size() steps instead of 10000 // hvd.size(); no checkpoint saved; no
#       horovod.run path (run it with horovodrun or mpirun).
#   (b) gtopk_hvd: the import `import gtopk_hvd.tensorflow as gtopk` and the compression
#       argument of hvd.DistributedGradientTape (`--gtopk-density D`:
#       compression=gtopk.Compression.gtopk(D); 0, the default: Horovod's call as is).
#   (c) Keras 3 (TensorFlow's default tf.keras): Horovod 0.28's DistributedGradientTape and
#       broadcast_variables fail on Keras 3 variables, so gtopk_hvd's (same arguments) are
#       used there; `opt.variables` is a property. tf-keras (TF_USE_LEGACY_KERAS=1) runs
#       Horovod's as upstream does. Marked "# Keras 3:".
#   (d) a final `TEST_ACCURACY` line (digits' test split) on rank 0 and a
#       `CHECKSUM rank=<r> <sha256>` line of the model's variables on every rank, for
#       tests/horovod/test_horovod_examples.py (which also reads a `KERAS_3 rank=<r> True/False`
# line).
import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import gtopk_hvd.tensorflow as gtopk  # gtopk_hvd: the import (before hvd.init())
from gtopk_hvd.tensorflow.keras import broadcast_variables  # Keras 3: see below

# Keras 3: Horovod 0.28 predates it (tf-keras, TF_USE_LEGACY_KERAS=1, has no keras.version()).
KERAS_3 = hasattr(tf.keras, 'version') and tf.keras.version().startswith('3.')

parser = argparse.ArgumentParser(description='TensorFlow 2 MNIST Example (digits)')
parser.add_argument('--gtopk-density', type=float, default=0.0,
                    help='gtopk_hvd: gTop-k density (0: Horovod\'s dense allreduce)')


def load_data():
    """Digits as MNIST-shaped 28x28 uint8-range images, split 80/20 the same way everywhere."""
    digits = load_digits()
    images = np.kron(digits.images * (255.0 / 16.0), np.ones((3, 3)))  # 8x8 -> 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target)
    return (x_train, y_train), (x_test, y_test)


def main(args):
    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    (mnist_images, mnist_labels), (test_images, test_labels) = load_data()

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
                 tf.cast(mnist_labels, tf.int64))
    )
    dataset = dataset.repeat().shuffle(10000).batch(32)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
        tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax')
    ])
    loss = tf.losses.SparseCategoricalCrossentropy()

    # Horovod: adjust learning rate based on number of GPUs.
    opt = tf.optimizers.Adam(0.001 * hvd.size())

    compression = hvd.Compression.none
    if args.gtopk_density:  # gtopk_hvd: the one changed argument
        compression = gtopk.Compression.gtopk(args.gtopk_density)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: add Horovod Distributed GradientTape.
        if KERAS_3:  # Keras 3: Horovod's tape fails on Keras 3 variables; gtopk_hvd's does not
            tape = gtopk.DistributedGradientTape(tape, compression=compression)
        else:
            tape = hvd.DistributedGradientTape(tape, compression=compression)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        #
        # Note: broadcast should be done after the first gradient step to ensure optimizer
        # initialization.
        if first_batch:
            if KERAS_3:  # Keras 3: hvd.broadcast_variables fails; opt.variables is a property
                broadcast_variables(mnist_model.variables, root_rank=0)
                broadcast_variables(opt.variables, root_rank=0)
            else:
                hvd.broadcast_variables(mnist_model.variables, root_rank=0)
                hvd.broadcast_variables(opt.variables(), root_rank=0)

        return loss_value

    # Horovod: adjust number of steps based on number of GPUs.
    for batch, (images, labels) in enumerate(dataset.take(160 // hvd.size())):
        loss_value = training_step(images, labels, batch == 0)

        if batch % 10 == 0 and hvd.rank() == 0:
            print('Step #%d\tLoss: %.6f' % (batch, loss_value))

    probs = mnist_model(test_images[..., np.newaxis].astype(np.float32) / 255.0, training=False)
    test_accuracy = np.mean(np.argmax(probs.numpy(), axis=1) == test_labels)
    if hvd.rank() == 0:
        print('TEST_ACCURACY %.4f' % test_accuracy, flush=True)
    digest = hashlib.sha256()
    for variable in mnist_model.variables:
        digest.update(np.asarray(variable.numpy()).tobytes())
    print('CHECKSUM rank=%d %s' % (hvd.rank(), digest.hexdigest()), flush=True)
    print(f'KERAS_3 rank={hvd.rank()} {KERAS_3}', flush=True)


if __name__ == '__main__':
    # this is running via horovodrun or mpirun
    main(parser.parse_args())
