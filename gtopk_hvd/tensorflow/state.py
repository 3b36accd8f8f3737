"""`GTopkState`: this worker's error-feedback state, as an object `tf.train.Checkpoint` saves.

`gtopk_hvd.core.SparseStep` (numpy) stays the source of truth; this object holds one
and copies it out when a checkpoint is written and back in when one is read:

    saved under <name>/.ATTRIBUTES/:  residual  float32 [d]   this worker's residual r
                                      velocity  float32 [d]   momentum-correction u ([0]: none)
                                      step      int64   []    optimizer steps taken

(read them with `tf.train.load_variable(path, "gtopk/.ATTRIBUTES/residual")`). Residuals differ
between workers: every worker saves its own checkpoint. The `SparseStep` is made at the first
gradient step, from the sizes of the sources; a checkpoint read before that (the usual resume:
build, restore, train) is kept and loaded into it when it is made. A state read before anything
was ever saved in it (all three empty) leaves a fresh start.

Copying on save and restore, rather than keeping the arrays in tf.Variables, costs one copy of d
values per save and none per step: the step runs on numpy arrays in place.

What TensorFlow allows per step: its gradients are separate immutable tensors, so fusing them is
one copy (tf.concat) and splitting the update into per-source tensors another (tf.split); the
update itself is written in one pass (zero + scatter, `ops.write_sparse`) into a new array,
since TensorFlow may alias the memory of the numpy array it gets. The selection is one fused
pass, as in the torch adapter, which needs neither copy (its gradients are views of the buffer).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.trackable import base as trackable_base

from gtopk_hvd.arguments import Arguments
from gtopk_hvd.core import SparseStep, StepStats
from gtopk_hvd.core.agreement import signature
from gtopk_hvd.core.elastic import follow_horovod
from gtopk_hvd.core.passes import PassAccumulator
from gtopk_hvd.layout import FusedLayout
from gtopk_hvd.tensorflow.join import register as register_for_join
from gtopk_hvd.transports import Transport, resolve_for_horovod


class GTopkState(trackable_base.Trackable):
    """The residual, velocity and step count of one set of sources (one model's gradients).

    Made empty; `bind` (at the first gradient step) makes its `SparseStep`. Add it to a
    `tf.train.Checkpoint` (e.g. `tf.train.Checkpoint(model=..., gtopk=state)`) to save and
    resume it; `gtopk_hvd.tensorflow.keras.DistributedOptimizer` tracks its own as the
    optimizer's `gtopk_state`, so checkpointing the optimizer is enough there.
    """

    def __init__(self) -> None:
        self.sparse: SparseStep | None = None
        self._transport: Transport | str | None = None
        self._signature: str | None = None
        self._pending: dict | None = None
        self._passes: PassAccumulator | None = None

    # -- making it ----------------------------------------------------------------------------

    def bind(self, layout: FusedLayout, arguments: Arguments,
             transport: Transport | str | None = None) -> None:
        """Makes the SparseStep on first use; later, checks it is used the same way.

        The tape and the Keras optimizer call it at every gradient step, before `step`. A
        checkpoint read before the first call is loaded into the SparseStep made here.

        Args:
            layout: the fused layout of the sources (`gtopk_hvd.layout.FusedLayout`: their
                names, shapes and dtypes, in order).
            arguments: Horovod's arguments as `gtopk_hvd.arguments.parse_arguments` checked
                them: the compression, op, gradient_predivide_factor, backward passes.
            transport: how the sparse step communicates (`gtopk_hvd.transports`: a registered
                name or a Transport; None: MPI under an MPI launcher, else Horovod's
                collectives); used at the first call only.

        Raises:
            ValueError: a later call with other sources or other arguments than the first (one
                GTopkState per model), or a checkpoint read before the first call that does not
                fit the sources.
            RuntimeError: at the first call, a transport whose workers are not Horovod's.
        """
        options = {"passes": arguments.passes}
        used = signature(layout.signature, compression=arguments.compression,
                         average=arguments.average, predivide=arguments.predivide, **options)
        if self.sparse is not None:
            if used != self._signature:
                raise ValueError(
                    "gtopk_hvd: this GTopkState was made for other sources or another "
                    f"compression ({self._signature[:300]}), not {used[:300]}; use one "
                    "GTopkState per model")
            return
        import horovod.tensorflow as hvd

        self._transport = transport
        self.sparse = SparseStep(arguments.compression, layout.sizes,
                                 resolve_for_horovod(transport, hvd), average=arguments.average,
                                 predivide=arguments.predivide, layout=layout.signature,
                                 options=options, what="source")
        self._signature = used
        register_for_join(self)
        if self._pending is not None:
            pending, self._pending = self._pending, None
            if "residual" in pending:
                self.load_state_dict(pending)
            else:  # restart_at before the first step
                self.sparse.step_count = pending["step"]

    # -- one step -----------------------------------------------------------------------------

    def step(self, flat: np.ndarray, passes: int = 1, average_passes: bool = False
             ) -> np.ndarray | None:
        """One sparse step on the fused local gradient `flat` (float32, d values, read only).

        With passes > 1 the gradients of `passes` calls are summed (averaged if average_passes)
        locally first: the first passes - 1 calls return None and communicate nothing.

        Args:
            flat: this worker's gradients fused into one float32 vector of d values, in the
                order of the layout given to `bind`; not written.
            passes: backward_passes_per_step, >= 1: calls summed before each step. Read at the
                first call, and again after `join`, `load_state_dict` or `restart_at`.
            average_passes: with passes > 1, the sum is divided by passes (False: summed).

        Returns:
            The dense update, a new float32 array of d values: zero outside the global set,
            scaled as `SparseStep.update` scales it (averaged over the workers, or summed), the
            same on every worker; all NaN for a step skipped for a NaN/Inf on any worker (the
            compression's nonfinite="propagate"). None for the first passes - 1 calls of each
            cycle.

        Raises:
            RuntimeError: called before `bind`.
            ValueError: at the first step, workers whose sources or compressions differ (on
                every worker alike).
            FloatingPointError: a NaN or Inf on any worker with the compression's
                nonfinite="raise" (on every worker alike).
        """
        if self.sparse is None:
            raise RuntimeError("GTopkState.step before bind")
        if self._passes is None:
            self._passes = PassAccumulator(passes, average_passes)
        total = self._passes.add(flat)
        if total is None:
            return None
        import horovod.tensorflow as hvd

        # Elastic Horovod: after a reset, the step over the new workers (core/elastic.py).
        self.sparse = follow_horovod(self.sparse, self._transport, hvd)
        # A new array each step: TensorFlow may keep using the memory it is handed. A sum of
        # several passes is ours: the step may clear it in its pass.
        return self.sparse.update(total, np.empty(self.sparse.d, dtype=np.float32),
                                  clear_gradient=total is not flat)

    def join(self) -> int:
        """Uneven data: takes part in the other workers' sparse steps with an empty
        contribution until every worker has joined (`gtopk_hvd.core.join`; `hvd.join()` calls it
        once gtopk_hvd.tensorflow is imported).

        Gradients summed towards a step not yet made are dropped; the model does not move
        (broadcast from the returned rank afterwards).

        Returns:
            The rank that joined last, the same on every worker.
        """
        import horovod.tensorflow as hvd

        self._passes = None
        self.sparse = follow_horovod(self.sparse, self._transport, hvd)
        return self.sparse.join()

    @property
    def passes_accumulated(self) -> int:
        """Calls summed so far in the current cycle of backward_passes_per_step (0 after a
        step)."""
        return 0 if self._passes is None else self._passes.calls

    @property
    def last_stats(self) -> StepStats | None:
        """What the last step did on this worker (None before the first)."""
        return None if self.sparse is None else self.sparse.last_stats

    # -- checkpoint ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """This worker's residual, velocity (if any) and step count, as numpy copies.

        Returns:
            {"residual": float32 [d], "step": int}, with "velocity" (float32 [d]) under
            momentum correction and "scheme" when the scheme keeps a state of its own. Before
            the first step: what was loaded and is kept for it ({"step": n} after
            `restart_at`), or {} if nothing was.
        """
        if self.sparse is None:
            return dict(self._pending) if self._pending is not None else {}
        return self.sparse.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Loads what `state_dict` returned (kept until the first step if not yet bound).

        A cycle of backward passes summed before the load is dropped.

        Args:
            state: what `state_dict` returned on this worker: "residual", "step", and
                "velocity" where the compression has momentum correction ("scheme" optional);
                an empty dict leaves the state as it is.

        Raises:
            ValueError: a residual of another size than the sources', or no velocity where the
                compression needs one; raised here once bound, else by the first `bind`.
        """
        if not state:
            return
        self._passes = None  # a cycle of backward passes summed before the load is dropped
        if self.sparse is None:
            self._pending = dict(state)
        else:
            self.sparse.load_state_dict(state)

    def restart_at(self, step: int) -> None:
        """Zero residual and velocity, `step` steps taken (Elastic Horovod's restore of a commit
        made before this worker's first sparse step).

        Args:
            step: the optimizer steps taken, where the step count (and so the density warm-up)
                goes on from; kept until the first step if not yet bound.
        """
        self._passes = None
        if self.sparse is None:
            self._pending = {"step": int(step)}
        else:
            self.sparse = self.sparse.restarted(step)

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        state = self.state_dict()
        empty = np.zeros(0, dtype=np.float32)
        with tf.init_scope():
            return {
                "residual": tf.constant(state.get("residual", empty)),
                "velocity": tf.constant(state.get("velocity", empty)),
                "step": tf.constant(np.int64(state.get("step", 0))),
            }

    def _restore_from_tensors(self, restored_tensors: dict[str, tf.Tensor]) -> tf.Operation:
        residual = restored_tensors["residual"].numpy()
        velocity = restored_tensors["velocity"].numpy()
        if residual.size:
            state = {"residual": residual, "step": int(restored_tensors["step"].numpy())}
            if velocity.size:
                state["velocity"] = velocity
            self.load_state_dict(state)
        return tf.no_op()
