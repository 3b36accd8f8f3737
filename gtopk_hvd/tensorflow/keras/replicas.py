"""Keras variables across workers, for Keras 3 and tf-keras alike: broadcast them from one worker
and check that every replica holds the same bytes.

horovod.tensorflow.keras' broadcast helpers fail on Keras 3 variables (Horovod 0.28 predates
Keras 3). These use horovod.tensorflow's collectives on plain tf tensors and `assign` the result,
which works for Keras 3 variables, tf-keras variables and tf.Variables. Run them eagerly
(callbacks are), with every worker calling them in the same order: each is a fixed sequence of
collectives whatever the local values, so a disagreement raises on every worker instead of
leaving some of them waiting.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

_SHOWN = 8  # variables named in a disagreement message, at most


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0) -> None:
    """Sets every variable on every worker to its value on worker `root_rank`.

    Args:
        variables: Keras 3, tf-keras or tf.Variables, each given a value by `assign`; every
            worker passes its own copies of the same variables, in the same order (one
            broadcast each, named by position).
        root_rank: the worker whose values every other one takes.
    """
    import horovod.tensorflow as hvd

    for position, variable in enumerate(variables):
        value = hvd.broadcast(tf.convert_to_tensor(variable), root_rank,
                              name=f"gtopk_hvd_broadcast_{position}")
        variable.assign(value)


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's variables that exist now (iterations, slots once built)."""
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def model_weights(model: Any, trainable_only: bool = False) -> list[Any]:
    """The model's weights (trainable and not, or trainable only) that exist now: [] for a model
    not built yet (tf-keras raises for an unbuilt Sequential; Keras 3 returns []). Keras 3's
    `model.variables` also holds metric and seed-generator state, which is per worker: these
    are left out."""
    try:
        return list(model.trainable_weights if trainable_only else model.weights)
    except ValueError:  # tf-keras: "Weights for model ... have not yet been created"
        return []


def variable_name(variable: Any) -> str:
    """A readable name: Keras 3's `path`, else the tf-keras / tf.Variable `name`."""
    return str(getattr(variable, "path", None) or getattr(variable, "name", "?"))


def allgather_rows(rows: np.ndarray, name: str) -> list[np.ndarray]:
    """Every worker's int64 rows ([n, width], n may differ between workers), in rank order.
    Two collectives on every worker, whatever n is."""
    import horovod.tensorflow as hvd

    rows = np.ascontiguousarray(rows, dtype=np.int64)
    counts = hvd.allgather(tf.constant([rows.shape[0]], tf.int64), name=f"{name}_counts")
    gathered = hvd.allgather(tf.constant(rows), name=f"{name}_rows").numpy()
    ends = np.cumsum(counts.numpy())
    return np.split(gathered, ends[:-1])


def _digest(variable: Any) -> np.ndarray:
    """SHA-256 of a variable's (or array's) dtype, shape and bytes, as 4 int64."""
    value = variable.numpy() if hasattr(variable, "numpy") else variable
    value = np.ascontiguousarray(np.asarray(value))
    digest = hashlib.sha256(f"{value.dtype.str}{value.shape}".encode())
    digest.update(value.tobytes())
    return np.frombuffer(digest.digest(), dtype=np.int64)


def _disagreement(names: Sequence[str], everyone: list[np.ndarray], what: str,
                  root_rank: int) -> str | None:
    """What differs between the workers' digests (row 0: all variables at once; row i:
    variable i - 1), or None if nothing does. The same on every worker but for the names,
    which are this worker's."""
    counts = [len(rows) - 1 for rows in everyone]
    if len(set(counts)) > 1:
        listed = ", ".join(f"rank {rank}: {count}" for rank, count in enumerate(counts))
        return f"{what}: the workers hold different numbers of variables ({listed})"
    reference = everyone[root_rank]
    if all(np.array_equal(rows[0], reference[0]) for rows in everyone):
        return None
    differing = []
    for index, name in enumerate(names):
        ranks = [rank for rank, rows in enumerate(everyone)
                 if not np.array_equal(rows[index + 1], reference[index + 1])]
        if ranks:
            differing.append(f"{name!r} (ranks {ranks})")
    shown = ", ".join(differing[:_SHOWN]) + (", ..." if len(differing) > _SHOWN else "")
    return (f"{what}: replicas disagree: {len(differing)} of {len(names)} variables differ "
            f"from rank {root_rank}: {shown}")


def check_replicas_agree(variables: Iterable[Any], what: str = "variables",
                         root_rank: int = 0) -> None:
    """Checks that every worker holds bitwise the same `variables` (dtype, shape, bytes).

    One all-gather of SHA-256 digests (two collectives), whatever the values.

    Args:
        variables: variables or arrays (anything with `numpy()`, or that numpy reads); every
            worker passes its own copies of the same variables, in the same order.
        what: what they are, the start of the error message.
        root_rank: the worker the others are compared with.

    Raises:
        RuntimeError: on every worker, if the workers hold different numbers of variables or
            any differs from worker `root_rank`'s, naming those that differ (at most 8) and the
            ranks where they do.
    """
    variables = list(variables)
    digests = [_digest(variable) for variable in variables]
    combined = hashlib.sha256(b"".join(d.tobytes() for d in digests)).digest()
    rows = np.stack([np.frombuffer(combined, dtype=np.int64), *digests])
    everyone = allgather_rows(rows, "gtopk_hvd_check_replicas")
    problem = _disagreement([variable_name(v) for v in variables], everyone, what, root_rank)
    if problem is not None:
        raise RuntimeError(problem)
