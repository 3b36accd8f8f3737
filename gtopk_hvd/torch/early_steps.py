"""The DDP hook's buckets stepped as they arrive, on a thread of their own, while backward goes on.

With nonfinite="propagate" every worker skips an iteration alike when any worker's bucket holds a
NaN or Inf, so no bucket's step may count before the last bucket of every worker is in. Each
bucket that can (`starts_early`) therefore takes a tentative step (`gtopk_hvd.core.tentative`)
as it arrives: its selection and exchange run on one thread of the hook state's, while DDP's
backward computes the next buckets, and its state is left as it was. At the iteration's last
bucket:

1. the thread, after the early buckets' exchanges, counts the workers that saw a NaN or Inf in
   any bucket (one all-reduce of one integer, as the held steps' count);
2. the hook waits for the thread (the first error of an early step is raised here);
3. every early step is committed, or discarded when some worker saw one (all NaN, nothing
   changed), and the buckets that did not start early step with the same decision.

With nonfinite="raise" nothing waits for a decision: every bucket whose step is on the host
runs it on the thread as it arrives (`later`), and its future completes when it is done (DDP
waits for them at the end of backward; a FloatingPointError fails them, on every worker alike).

One thread keeps the exchanges, which are collectives, in DDP's bucket order, the same on every
worker; whether a bucket starts early depends only on what every worker shares (the
configuration, the bucket's dtype and device, the number of workers), so every worker takes the
same collectives in the same order. The results are bit-equal to the held steps'
(`TentativeStep`'s commit). What it saves is the early buckets' exchange where backward is
longer; their selection runs on the cores backward uses.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from gtopk_hvd import ops
from gtopk_hvd.core import SparseStep, TentativeStep, can_step_tentatively, count_workers
from gtopk_hvd.transports import Transport


def steps_on_thread(sparse: SparseStep, buffer: torch.Tensor, workers: int) -> bool:
    """Whether a bucket's step can run on the thread: more than one worker (else there is no
    exchange to hide), and the bucket and the step's state on the host."""
    return workers > 1 and buffer.device.type == "cpu" and sparse.backend.name == "numpy"


def starts_early(sparse: SparseStep, buffer: torch.Tensor, workers: int) -> bool:
    """Whether a bucket can take its tentative step as it arrives: `steps_on_thread`, a
    float32 bucket in its own contiguous buffer, and a step that can be tentative
    (`can_step_tentatively`: a scheme that takes the accumulated gradient, no momentum
    correction)."""
    return (steps_on_thread(sparse, buffer, workers) and buffer.dtype == torch.float32
            and buffer.is_contiguous() and can_step_tentatively(sparse))


class EarlySteps:
    """This iteration's early buckets (module docstring) and the thread that steps them.

    Fields: jobs, each early bucket's (TentativeStep, the thread's future of its run), in
    arrival order; nonfinite, whether one of them held a NaN or Inf on this worker; started,
    the steps this process ran on the thread (tentative or not); failed, the error of a step
    run by `later`, or None."""

    __slots__ = ("_thread", "failed", "jobs", "nonfinite", "started")

    def __init__(self) -> None:
        self.started = 0
        self.failed: BaseException | None = None
        self._thread: ThreadPoolExecutor | None = None
        self.jobs: list[tuple[TentativeStep, Future]] = []
        self.nonfinite = False

    def start(self, sparse: SparseStep, buffer: torch.Tensor) -> None:
        """Reads the bucket for NaN/Inf and starts its tentative step on the thread."""
        array = buffer.detach().numpy()
        finite = ops.all_finite(array)
        self.nonfinite = self.nonfinite or not finite
        tentative = TentativeStep(sparse, array, finite)
        self.jobs.append((tentative, self._executor().submit(tentative.run)))
        self.started += 1

    def later(self, step: Callable[[], None], buffer: torch.Tensor) -> torch.futures.Future:
        """nonfinite="raise": runs `step` on the thread; the returned future completes with
        `buffer` when it is done, or fails with its error. After a step's error every later
        step fails with it without running (no collective of this state is left running
        once DDP has raised: every worker raises at the same step, so all stop alike; the
        residuals hold the non-finite values, so the state is restored from a checkpoint,
        which starts afresh)."""
        done: torch.futures.Future = torch.futures.Future()

        def run() -> None:
            if self.failed is not None:
                raise self.failed
            try:
                step()
            except BaseException as error:
                self.failed = error
                raise

        def complete(run: Future) -> None:
            error = run.exception()
            if error is None:
                done.set_result(buffer)
            else:
                done.set_exception(error)

        self._executor().submit(run).add_done_callback(complete)
        self.started += 1
        return done

    def wait(self) -> None:
        """Waits until the thread has run everything given to it (before a step elsewhere
        issues collectives of its own)."""
        if self._thread is not None:
            self._thread.submit(lambda: None).result()

    def holds(self, sparse: SparseStep) -> bool:
        """Whether `sparse` took its step early in this iteration."""
        return any(tentative.step is sparse for tentative, _ in self.jobs)

    def decide(self, transport: Transport, nonfinite_here: bool) -> bool:
        """Steps 1 and 2: whether the iteration is skipped, counted on the thread after the
        early exchanges. nonfinite_here: whether a bucket that did not start early held a
        NaN/Inf on this worker."""
        count = self._executor().submit(count_workers, transport,
                                        nonfinite_here or self.nonfinite)
        for _, run in self.jobs:
            run.result()
        return count.result() > 0

    def finish(self, skipped: bool) -> None:
        """Step 3 for the early buckets: each committed, or discarded if `skipped`."""
        jobs, self.jobs, self.nonfinite = self.jobs, [], False
        for tentative, _ in jobs:
            if skipped:
                tentative.discard()
            else:
                tentative.commit()

    def clear(self) -> None:
        """Forgets this iteration's early steps (after an error): nothing is committed."""
        self.jobs, self.nonfinite = [], False

    def _executor(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gtopk_hook")
        return self._thread

    def __del__(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False)

