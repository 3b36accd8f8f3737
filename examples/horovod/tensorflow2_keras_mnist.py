# ruff: noqa: ANN001, ANN201 - Horovod's code kept as upstream wrote it
# Trimmed copy of horovod/examples/tensorflow2/tensorflow2_keras_mnist.py at v0.28.1,
# Copyright Horovod authors, Apache-2.0 (see tests/horovod_upstream/LICENSE).
# Changes:
#   (a) scikit-learn's digits (8x8, upscaled to MNIST's 28x28 by np.kron and a pad) instead of
#       tf.keras.datasets.mnist (no download); batches of 32 instead of 128,
#       steps_per_epoch=48 // hvd.size() instead of 500 // hvd.size(), 5 epochs instead of 24
#       (learning-rate warm-up over 2 of them instead of 3); no ModelCheckpoint (no files
#       written); no horovod.run path (run it with horovodrun or mpirun).
#   (b) gtopk_hvd: the import `import gtopk_hvd.tensorflow.keras as gtopk` and a compression
#       argument to hvd.DistributedOptimizer (`--gtopk-density D`:
#       compression=gtopk.Compression.gtopk(D); 0, the default: Horovod's
#       hvd.Compression.none, which is what upstream's call defaults to).
#   (c) Keras 3 (TensorFlow's default tf.keras), marked "# Keras 3:": Horovod 0.28's Keras
#       DistributedOptimizer fails on Keras 3 optimizers, so gtopk_hvd's (same arguments;
#       dense compressions run Horovod's allreduce) is used there; compile() without
#       experimental_run_tf_function (Keras 3 refuses it); the callbacks are gtopk_hvd's
#       replacements with Horovod's names and arguments (Horovod 0.28's fail on Keras 3 and,
#       in this environment, on tf-keras too). tf-keras (TF_USE_LEGACY_KERAS=1) otherwise runs
#       Horovod's code as upstream does.
#   (d) a final `TEST_ACCURACY` line (digits' test split) on rank 0 and a
#       `CHECKSUM rank=<r> <sha256>` line of the model's weights on every rank, for
#       tests/horovod/test_horovod_examples.py (which also reads a `KERAS_3 rank=<r> True/False`
# line).
import argparse
import hashlib

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import gtopk_hvd.tensorflow.keras as gtopk  # gtopk_hvd: the import (before hvd.init())

# Keras 3: Horovod 0.28 predates it (tf-keras, TF_USE_LEGACY_KERAS=1, has no keras.version()).
KERAS_3 = hasattr(tf.keras, 'version') and tf.keras.version().startswith('3.')

parser = argparse.ArgumentParser(description='TensorFlow 2 Keras MNIST Example (digits)')
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

    # Horovod: adjust learning rate based on number of GPUs.
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    compression = hvd.Compression.none
    if args.gtopk_density:  # gtopk_hvd: the one changed argument
        compression = gtopk.Compression.gtopk(args.gtopk_density)

    # Horovod: add Horovod DistributedOptimizer.
    # Keras 3: Horovod's fails on Keras 3 optimizers; gtopk_hvd's takes the same arguments.
    DistributedOptimizer = gtopk.DistributedOptimizer if KERAS_3 else hvd.DistributedOptimizer
    opt = DistributedOptimizer(
        opt, backward_passes_per_step=1, average_aggregated_gradients=True,
        compression=compression)

    # Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
    # uses hvd.DistributedOptimizer() to compute gradients.
    # Keras 3: compile() has no experimental_run_tf_function.
    compile_kwargs = {} if KERAS_3 else {'experimental_run_tf_function': False}
    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'],
                        **compile_kwargs)

    # Keras 3: gtopk.<Callback> in place of hvd.callbacks.<Callback> (same names, arguments).
    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        gtopk.BroadcastGlobalVariablesCallback(0),

        # Horovod: average metrics among workers at the end of every epoch.
        #
        # Note: This callback must be in the list before the ReduceLROnPlateau,
        # TensorBoard or other metrics-based callbacks.
        gtopk.MetricAverageCallback(),

        # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
        # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
        # the first three epochs. See https://arxiv.org/abs/1706.02677 for details.
        gtopk.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
    ]

    # Horovod: write logs on worker 0.
    verbose = 2 if hvd.rank() == 0 else 0

    # Train the model.
    # Horovod: adjust number of steps based on number of GPUs.
    mnist_model.fit(dataset, steps_per_epoch=48 // hvd.size(), callbacks=callbacks, epochs=5,
                    verbose=verbose)

    probs = mnist_model.predict(test_images[..., np.newaxis].astype(np.float32) / 255.0,
                                verbose=0)
    test_accuracy = np.mean(np.argmax(probs, axis=1) == test_labels)
    if hvd.rank() == 0:
        print(f'TEST_ACCURACY {test_accuracy:.4f}', flush=True)
    digest = hashlib.sha256()
    for variable in mnist_model.weights:  # not Keras 3's per-worker dropout seed states
        digest.update(np.asarray(variable.numpy()).tobytes())
    print(f'CHECKSUM rank={hvd.rank()} {digest.hexdigest()}', flush=True)
    print(f'KERAS_3 rank={hvd.rank()} {KERAS_3}', flush=True)


if __name__ == '__main__':
    # this is running via horovodrun or mpirun
    main(parser.parse_args())
