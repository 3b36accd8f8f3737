"""The Keras callbacks of horovod.tensorflow.keras.callbacks, for Keras 3 and tf-keras alike, and
the helpers under them (Horovod 0.28's fail on Keras 3, and some on tf-keras 2.21):

- `BroadcastGlobalVariablesCallback(root_rank=0)`: broadcasts the model's and the optimizer's
  variables as soon as they exist (also for models built only in the first batch), then checks
  that every replica agrees (`gtopk_hvd.tensorflow.keras.broadcast`);
- `MetricAverageCallback()`: epoch logs averaged over the workers;
- `LearningRateScheduleCallback(...)`, `LearningRateWarmupCallback(...)`: Horovod's schedules;
- `broadcast_variables(variables, root_rank)`, `check_replicas_agree(variables, what)`: the
  same outside a callback (e.g. in a custom training loop).

The base class is `tf.keras.callbacks.Callback`: Keras 3's by default, tf-keras' under
TF_USE_LEGACY_KERAS=1 (set before TensorFlow is imported).
"""

from gtopk_hvd.tensorflow.keras.broadcast import BroadcastGlobalVariablesCallback
from gtopk_hvd.tensorflow.keras.learning_rate import (
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
)
from gtopk_hvd.tensorflow.keras.metric_average import MetricAverageCallback, average_logs
from gtopk_hvd.tensorflow.keras.replicas import (
    broadcast_variables,
    check_replicas_agree,
    model_weights,
    optimizer_variables,
)

__all__ = ["BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback", "MetricAverageCallback", "average_logs",
           "broadcast_variables", "check_replicas_agree", "model_weights", "optimizer_variables"]
