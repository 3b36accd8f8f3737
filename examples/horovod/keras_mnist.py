# Trimmed copy of horovod/examples/keras/keras_mnist.py at v0.28.1,
# Copyright Horovod authors, Apache-2.0 (see tests/horovod_upstream/LICENSE).
# Changes:
#   (a) scikit-learn's digits (8x8, upscaled to MNIST's 28x28 by np.kron and a pad) instead of
#       keras.datasets.mnist (no download); epochs = ceil(8 / hvd.size()) instead of
#       ceil(12 / hvd.size()); no ModelCheckpoint (no files written); the TF1 session setup
#       (tf.ConfigProto, K.set_session: gone from TensorFlow 2) replaced by TF2's GPU pinning.
#   (b) gtopk_hvd: the import `import gtopk_hvd.tensorflow.keras as gtopk` and a compression
#       argument to hvd.DistributedOptimizer (`--gtopk-density D`:
#       compression=gtopk.Compression.gtopk(D); 0, the default: Horovod's
#       hvd.Compression.none, which is what upstream's call defaults to).
#   (c) Keras 3 (`import keras` is Keras 3 here), marked "# Keras 3:": Horovod 0.28's
#       DistributedOptimizer fails on Keras 3 optimizers, so gtopk_hvd's (same arguments; dense
#       compressions run Horovod's allreduce) is used there; the broadcast callback is
#       gtopk_hvd's replacement with Horovod's name and arguments (Horovod 0.28's fails on
#       Keras 3 and, in this environment, on tf-keras too). With TF_USE_LEGACY_KERAS=1 the
#       script imports tf_keras as keras (marked "# tf-keras:"), since `import keras` stays
#       Keras 3, and otherwise runs Horovod's code as upstream does.
#   (d) a final `TEST_ACCURACY` line (digits' test split) on rank 0 and a
#       `CHECKSUM rank=<r> <sha256>` line of the model's weights on every rank, for
#       tests/horovod/test_horovod_examples.py (which also reads a `KERAS_3 rank=<r> True/False`
# line).
import argparse
import hashlib
import math
import os

import horovod.keras as hvd
import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import gtopk_hvd.tensorflow.keras as gtopk  # gtopk_hvd: the import (before hvd.init())

if os.environ.get('TF_USE_LEGACY_KERAS') == '1':  # tf-keras: `import keras` is Keras 3
    import tf_keras as keras
# tf-keras: names taken from the `keras` chosen above (`from keras... import` is Keras 3).
K = keras.backend
Sequential = keras.models.Sequential
Conv2D, Dense, Dropout = keras.layers.Conv2D, keras.layers.Dense, keras.layers.Dropout
Flatten, MaxPooling2D = keras.layers.Flatten, keras.layers.MaxPooling2D

# Keras 3: Horovod 0.28 predates it.
KERAS_3 = keras.__version__.startswith('3.')

parser = argparse.ArgumentParser(description='Keras MNIST Example (digits)')
parser.add_argument('--gtopk-density', type=float, default=0.0,
                    help='gtopk_hvd: gTop-k density (0: Horovod\'s dense allreduce)')
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

batch_size = 128
num_classes = 10

# Horovod: adjust number of epochs based on number of GPUs.
epochs = int(math.ceil(8.0 / hvd.size()))

# Input image dimensions
img_rows, img_cols = 28, 28

# The data, shuffled and split between train and test sets
digits = load_digits()
images = np.kron(digits.images * (255.0 / 16.0), np.ones((3, 3)))  # 8x8 -> 24x24
images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
x_train, x_test, y_train, y_test = train_test_split(
    images, digits.target, test_size=0.2, random_state=0, stratify=digits.target)

if K.image_data_format() == 'channels_first':
    x_train = x_train.reshape(x_train.shape[0], 1, img_rows, img_cols)
    x_test = x_test.reshape(x_test.shape[0], 1, img_rows, img_cols)
    input_shape = (1, img_rows, img_cols)
else:
    x_train = x_train.reshape(x_train.shape[0], img_rows, img_cols, 1)
    x_test = x_test.reshape(x_test.shape[0], img_rows, img_cols, 1)
    input_shape = (img_rows, img_cols, 1)

x_train = x_train.astype('float32')
x_test = x_test.astype('float32')
x_train /= 255
x_test /= 255
print('x_train shape:', x_train.shape)
print(x_train.shape[0], 'train samples')
print(x_test.shape[0], 'test samples')

# Convert class vectors to binary class matrices
labels_test = y_test
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

model = Sequential()
model.add(Conv2D(32, kernel_size=(3, 3),
                 activation='relu',
                 input_shape=input_shape))
model.add(Conv2D(64, (3, 3), activation='relu'))
model.add(MaxPooling2D(pool_size=(2, 2)))
model.add(Dropout(0.25))
model.add(Flatten())
model.add(Dense(128, activation='relu'))
model.add(Dropout(0.5))
model.add(Dense(num_classes, activation='softmax'))

# Horovod: adjust learning rate based on number of GPUs.
opt = keras.optimizers.Adadelta(1.0 * hvd.size())

compression = hvd.Compression.none
if args.gtopk_density:  # gtopk_hvd: the one changed argument
    compression = gtopk.Compression.gtopk(args.gtopk_density)

# Horovod: add Horovod Distributed Optimizer.
# Keras 3: Horovod's fails on Keras 3 optimizers; gtopk_hvd's takes the same arguments.
DistributedOptimizer = gtopk.DistributedOptimizer if KERAS_3 else hvd.DistributedOptimizer
opt = DistributedOptimizer(opt, compression=compression)

model.compile(loss=keras.losses.categorical_crossentropy,
              optimizer=opt,
              metrics=['accuracy'])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    # Keras 3: gtopk.<Callback> in place of hvd.callbacks.<Callback> (same name, arguments).
    gtopk.BroadcastGlobalVariablesCallback(0),
]

model.fit(x_train, y_train,
          batch_size=batch_size,
          callbacks=callbacks,
          epochs=epochs,
          verbose=2 if hvd.rank() == 0 else 0,
          validation_data=(x_test, y_test))
score = model.evaluate(x_test, y_test, verbose=0)
print('Test loss:', score[0])
print('Test accuracy:', score[1])

predictions = np.argmax(model.predict(x_test, verbose=0), axis=1)
if hvd.rank() == 0:
    print(f'TEST_ACCURACY {np.mean(predictions == labels_test):.4f}', flush=True)
digest = hashlib.sha256()
for weight in model.get_weights():
    digest.update(np.asarray(weight).tobytes())
print(f'CHECKSUM rank={hvd.rank()} {digest.hexdigest()}', flush=True)
print(f'KERAS_3 rank={hvd.rank()} {KERAS_3}', flush=True)
