# ruff: noqa: ANN001, ANN201, UP008, UP031, UP032 - Horovod's code kept as upstream wrote it
# Trimmed copy of horovod/examples/tensorflow2/tensorflow2_synthetic_benchmark.py at v0.28.1,
# Copyright Horovod authors, Apache-2.0 (see tests/horovod_upstream/LICENSE).
# Changes:
#   (a) small sizes: --model 'cnn' (the default, a small Sequential defined here) or any
#       tf.keras.applications name (built with input_shape=(32, 32, 3), classes=10) on
#       32x32x3 fake images and 10 classes, instead of ResNet50 on 224x224x3 and 1000 classes;
#       --batch-size 16, --num-warmup-batches 2, --num-batches-per-iter 5, --num-iters 3.
#   (b) gtopk_hvd: the import `import gtopk_hvd.tensorflow as gtopk` and the compression line
#       (`--gtopk-density D`: gtopk.Compression.gtopk(D); 0, the default: Horovod's line as is).
#   (c) Keras 3 (TensorFlow's default tf.keras): Horovod 0.28's DistributedGradientTape and
#       broadcast_variables fail on Keras 3 variables, so gtopk_hvd's (same arguments) are
#       used there; `opt.variables` is a property. tf-keras (TF_USE_LEGACY_KERAS=1) runs
#       Horovod's as upstream does. Marked "# Keras 3:".
#   (d) a final `CHECKSUM rank=<r> <sha256>` line of the trainable variables on every rank
#       (batch-norm statistics of an applications model follow each worker's own fake data),
#       and a `KERAS_3 rank=<r> True/False` line, for tests/horovod/test_horovod_examples.py.
import argparse
import hashlib
import os
import timeit

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from tensorflow.keras import applications

import gtopk_hvd.tensorflow as gtopk  # gtopk_hvd: the import (before hvd.init())
from gtopk_hvd.tensorflow.keras import broadcast_variables  # Keras 3: see below

# Keras 3: Horovod 0.28 predates it (tf-keras, TF_USE_LEGACY_KERAS=1, has no keras.version()).
KERAS_3 = hasattr(tf.keras, 'version') and tf.keras.version().startswith('3.')

parser = argparse.ArgumentParser(description='TensorFlow Synthetic Benchmark',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--fp16-allreduce', action='store_true', default=False,
                    help='use fp16 compression during allreduce')

parser.add_argument('--model', type=str, default='cnn',
                    help='model to benchmark (cnn, or a tf.keras.applications name)')
parser.add_argument('--batch-size', type=int, default=16,
                    help='input batch size')

parser.add_argument('--num-warmup-batches', type=int, default=2,
                    help='number of warm-up batches that don\'t count towards benchmark')
parser.add_argument('--num-batches-per-iter', type=int, default=5,
                    help='number of batches per benchmark iteration')
parser.add_argument('--num-iters', type=int, default=3,
                    help='number of benchmark iterations')

parser.add_argument('--no-cuda', action='store_true', default=False,
                    help='disables CUDA training')
parser.add_argument('--gtopk-density', type=float, default=0.0,
                    help='gtopk_hvd: gTop-k density (0: Horovod\'s dense allreduce)')


args = parser.parse_args()
args.cuda = not args.no_cuda

hvd.init()

if args.cuda:
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')
else:
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

if args.model == 'cnn':
    model = tf.keras.Sequential([
        tf.keras.Input((32, 32, 3)),
        tf.keras.layers.Conv2D(16, 3, activation='relu'),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation='relu'),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation='relu'),
        tf.keras.layers.Dense(10, activation='softmax'),
    ])
else:
    model = getattr(applications, args.model)(weights=None, input_shape=(32, 32, 3),
                                              classes=10)
opt = tf.optimizers.SGD(0.01)

data = tf.random.uniform([args.batch_size, 32, 32, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=10, dtype=tf.int64)


@tf.function
def benchmark_step(first_batch):
    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    if args.gtopk_density:  # gtopk_hvd: the one changed line
        compression = gtopk.Compression.gtopk(args.gtopk_density)

    # Horovod: use DistributedGradientTape
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, probs)

    # Horovod: add Horovod Distributed GradientTape.
    if KERAS_3:  # Keras 3: Horovod's tape fails on Keras 3 variables; gtopk_hvd's does not
        tape = gtopk.DistributedGradientTape(tape, compression=compression)
    else:
        tape = hvd.DistributedGradientTape(tape, compression=compression)

    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    #
    # Note: broadcast should be done after the first gradient step to ensure optimizer
    # initialization.
    if first_batch:
        if KERAS_3:  # Keras 3: hvd.broadcast_variables fails; opt.variables is a property
            broadcast_variables(model.variables, root_rank=0)
            broadcast_variables(opt.variables, root_rank=0)
        else:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end='\n' if nl else '')


log('Model: %s' % args.model)
log('Batch size: %d' % args.batch_size)
device = 'GPU' if args.cuda else 'CPU'
log('Number of %ss: %d' % (device, hvd.size()))


with tf.device(device):
    # Warm-up
    log('Running warmup...')
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False),
                  number=args.num_warmup_batches)

    # Benchmark
    log('Running benchmark...')
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(lambda: benchmark_step(first_batch=False),
                             number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log('Iter #%d: %.1f img/sec per %s' % (x, img_sec, device))
        img_secs.append(img_sec)

    # Results
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log('Img/sec per %s: %.1f +-%.1f' % (device, img_sec_mean, img_sec_conf))
    log('Total img/sec on %d %s(s): %.1f +-%.1f' %
        (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))

digest = hashlib.sha256()
for variable in model.trainable_variables:
    digest.update(np.asarray(variable.numpy()).tobytes())
print('CHECKSUM rank=%d %s' % (hvd.rank(), digest.hexdigest()), flush=True)
print(f'KERAS_3 rank={hvd.rank()} {KERAS_3}', flush=True)
