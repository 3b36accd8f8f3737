"""The sparse all-reduce of a list of TensorFlow gradients, eager or inside tf.function.

    flat = concat(reshape(float32(g_i), [-1]) for every source i)      (None: n_i zeros;
                                                                        IndexedSlices: densified)
    update = GTopkState.step(flat)        (numpy: the core's SparseStep, gtopk_hvd.core.step)
    result_i = cast(reshape(update[o_i : o_i + n_i], shape_i), dtype_i)   (for every source)

A source whose gradient is None on this worker (unused, or used only on some workers by a
rank-dependent branch) contributes zeros and still gets the reduced update back, as
horovod.torch does for parameters without gradients: every worker returns a tensor for every
source, the same on all, so replicas cannot diverge by some workers skipping an update that the
others apply. Where no worker had a gradient the update is zero (residuals of earlier steps
aside); an optimizer then applies a zero gradient (weight decay and momentum still act).

Eagerly the numpy step runs directly. Inside a tf.function it runs in `tf.py_function`: the
graph stops there, the fused gradient (d float32 values) is copied to the host and read as numpy,
the update (d values) comes back as a new tensor, and the graph goes on. That costs one host
round trip per step, keeps the step out of XLA (`jit_compile=True` cannot compile it and is
refused with a clear error) and out of graph optimisations across it; the selection and the
communication themselves cost the same as eagerly. Errors the step raises (FloatingPointError
for a NaN/Inf gradient on any worker, ValueError when workers disagree on the sources) reach the
caller of a tf.function as a `tf.errors.OpError` carrying the same message.

Embedding gradients (`tf.IndexedSlices`) are densified with `tf.convert_to_tensor`, since the
selection works on the fused dense vector: the rows an embedding did not touch are zeros there,
but residuals of earlier steps may still select them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from gtopk_hvd.arguments import Arguments
from gtopk_hvd.layout import FusedLayout, Source
from gtopk_hvd.tensorflow.state import GTopkState
from gtopk_hvd.transports import Transport

_UNIQUE_SUFFIX = re.compile(r"_\d+(?=/|$)")


def source_name(source: Any, position: int) -> str:
    """A name that is the same on every worker: a Keras 3 variable's path or a tf.Variable's
    name without the numbers Keras and TensorFlow append to make names unique in a process
    ("sequential_3/dense_7/kernel" -> "sequential/dense/kernel", "dense/kernel:0" ->
    "dense/kernel"), since those count every layer made before, which may differ between
    workers; a watched tensor is named by its position."""
    for attribute in ("path", "name"):
        try:
            name = getattr(source, attribute, None)
        except (AttributeError, ValueError):  # eager tensors have no name
            name = None
        if isinstance(name, str) and name:
            return _UNIQUE_SUFFIX.sub("", name.split(":")[0])
    return f"source.{position}"


def describe_sources(sources: Sequence[Any]) -> tuple[FusedLayout, list[tf.TensorShape],
                                                        list[tf.DType]]:
    """The sources' fused layout, shapes and dtypes. Raises ValueError for a source that is not
    floating point or has no static shape."""
    described, shapes, dtypes = [], [], []
    for position, source in enumerate(sources):
        name = source_name(source, position)
        dtype = tf.as_dtype(source.dtype)
        shape = tf.TensorShape(source.shape)
        if not shape.is_fully_defined():
            raise ValueError(f"source {name!r} has shape {shape}; the sparse all-reduce needs "
                             "sources of static shape")
        described.append(Source(name, tuple(shape.as_list()), dtype.name, dtype.is_floating))
        shapes.append(shape)
        dtypes.append(dtype)
    return FusedLayout(described, what="source"), shapes, dtypes


def _fuse(gradients: Sequence[Any], sizes: Sequence[int]) -> tf.Tensor:
    parts = []
    for gradient, size in zip(gradients, sizes):
        if gradient is None:  # unused source: zeros, so every worker fuses the same layout
            parts.append(tf.zeros([size], dtype=tf.float32))
            continue
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)
        parts.append(tf.reshape(tf.cast(gradient, tf.float32), [-1]))
    return tf.concat(parts, axis=0)


def _refuse_xla() -> None:
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - private module moved: skip the check
        return
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError("gtopk_hvd's sparse compression runs on the host through "
                         "tf.py_function, which XLA cannot compile: use jit_compile=False "
                         "(tf.function(jit_compile=False), model.compile(jit_compile=False))")


def sparse_allreduce(state: GTopkState, gradients: Sequence[Any], sources: Sequence[Any],
                     arguments: Arguments, average_passes: bool = False,
                     transport: Transport | str | None = None, apply_skipped: bool = True
                     ) -> tuple[list[Any], Any]:
    """The sparse all-reduce of `gradients` (one per source, None allowed): module docstring.

    Returns (reduced gradients, applied): tensors shaped and typed like the sources, one for
    every source, also where this worker's gradient was None (it contributed zeros: module
    docstring), and whether this call completed a step. With passes > 1, the first
    passes - 1 calls of every `passes` only accumulate locally, return zeros and applied False.
    A step skipped for a NaN/Inf returns all-NaN gradients with applied True when
    apply_skipped (a loss scaler checks them next and skips), else zeros and applied False.
    `applied` is a Python bool eagerly, and inside a tf.function a scalar bool tensor (the
    constant True when passes == 1 and apply_skipped).
    """
    gradients, sources = list(gradients), list(sources)
    if len(gradients) != len(sources):
        raise ValueError(f"{len(gradients)} gradients for {len(sources)} sources")
    layout, shapes, dtypes = describe_sources(sources)
    state.bind(layout, arguments, transport)
    d, passes = layout.d, arguments.passes

    def numpy_step(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        update = state.step(flat, passes, average_passes)
        if update is None or (not apply_skipped and state.last_stats.skipped):
            return np.zeros(d, dtype=np.float32), np.array(False)
        return update, np.array(True)

    return fused_host_call(numpy_step, gradients, shapes, dtypes, passes,
                           "gtopk_sparse_allreduce", may_skip=not apply_skipped)


def fused_host_call(numpy_step: Any, gradients: Sequence[Any], shapes: Sequence[tf.TensorShape],
                    dtypes: Sequence[tf.DType], passes: int, name: str, may_skip: bool = False
                    ) -> tuple[list[Any], Any]:
    """gradients fused (float32, None as zeros), `numpy_step(flat) -> (update, applied)` on
    the host, and the update split back into tensors shaped and typed as `shapes` / `dtypes`:
    directly when eager, through tf.py_function (named `name`) inside a tf.function (module
    docstring). `applied`: a Python bool eagerly; in a graph a bool tensor (the constant True
    when passes == 1, unless may_skip: a step may come back not applied for another reason)."""
    sizes = [int(shape.num_elements()) for shape in shapes]
    flat = _fuse(gradients, sizes)
    if tf.executing_eagerly():
        update, applied = numpy_step(flat.numpy())
        update, applied = tf.convert_to_tensor(update), bool(applied)
    else:
        _refuse_xla()
        update, applied = tf.py_function(lambda f: numpy_step(f.numpy()), [flat],
                                         [tf.float32, tf.bool], name=name)
        update.set_shape([sum(sizes)])
        applied.set_shape([])
        if passes == 1 and not may_skip:
            applied = True
    pieces = tf.split(update, sizes) if len(sizes) > 1 else [update]
    reduced = [tf.cast(tf.reshape(piece, shape), dtype)
               for piece, shape, dtype in zip(pieces, shapes, dtypes)]
    return reduced, applied


class LocalSources:
    """The sources registered as worker-local (Horovod's register_local_source /
    register_local_var), by object identity; keeps them alive so their ids stay theirs."""

    def __init__(self) -> None:
        self._ids: set[int] = set()
        self._sources: list[Any] = []

    def add(self, source: Any) -> None:
        if id(source) not in self._ids:
            self._ids.add(id(source))
            self._sources.append(source)

    def holds(self, source: Any) -> bool:
        return id(source) in self._ids


def tf_variable(variable: Any) -> Any:
    """A Keras 3 variable's tf.Variable (Horovod keys variables by `ref()`, which Keras 3
    variables lack); anything else as it is."""
    if hasattr(variable, "ref"):
        return variable
    value = getattr(variable, "value", None)
    return value if isinstance(value, tf.Variable) else variable


def tf_variables(groups: Any) -> Any:
    """Horovod's `groups` (a number, or lists of variables) with Keras 3 variables as
    tf.Variables."""
    if isinstance(groups, list):
        return [tf_variables(item) for item in groups]
    return groups if groups is None or isinstance(groups, int) else tf_variable(groups)


def dense_allreduce(gradients: list[Any], variables: list[Any], arguments: Arguments,
                    sparse_as_dense: bool, groups: Any = None) -> list[Any]:
    """Horovod's own allreduce of a gradient list: the function its DistributedGradientTape and
    Keras wrapper run (`horovod.tensorflow._make_allreduce_grads_fn`: op incl. Adasum, Horovod's
    pre/post-scaling, fp16, groups, process sets, sparse_as_dense; None stays None), called with
    Keras 3 variables as their tf.Variables, on which Horovod's own wrappers fail."""
    import horovod.tensorflow as hvd

    allreduce = hvd._make_allreduce_grads_fn(
        "DistributedOptimizer", "", "", arguments.compression.horovod_compressor("tensorflow"),
        sparse_as_dense, arguments.op, arguments.predivide, tf_variables(groups),
        arguments.process_set)
    return allreduce(list(gradients), [tf_variable(v) for v in variables])
