"""gTop-k: the sparse all-reduce of top-k sets by recursive doubling (registered as "gtopk").

Shi et al., "A Distributed Synchronous SGD Algorithm with Global Top-k Sparsification for Low
Bandwidth Networks", ICDCS 2019. Each of P workers holds an index-sorted set of
at most k (index, value) entries. merge(a, b) = top-k by |value| of union(a, b), with values
summed where an index is in both; it is symmetric, so two workers that exchange sets and merge
compute the same set. Let P' be the largest power of two <= P:

    fold in   workers r >= P' send their set to r - P', which merges it        (1 message)
    rounds    for j = 0 .. log2(P') - 1: worker r exchanges with r XOR 2^j
              and merges                                                       (log2 P' messages)
    fold out  workers r < P - P' send the result to r + P'                     (1 message)

After the rounds every one of the first P' workers holds the same global set; values are sums,
not averages. Bytes per worker: log2(P') * 8k (+ 8k for each fold message), against
2 (P-1)/P * 4d for a dense ring all-reduce and (P-1) * 8k for Top-k all-gather.

Each data message is preceded by a zero-byte probe with the same partner (phase tag + 10), so
that the stats split the communication into waiting for the partner and transfer
(`gtopk_hvd.reductions.wait_probe`: on by default over MPI, GTOPK_HVD_WAIT_PROBE=1 / 0 forces).

Subtlety (accepted, as in the paper): an index of the global set may have lost one worker's
contribution in an intermediate merge (dropped in one subtree, re-entered from another).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd._arrays import framework_of, to_host_numpy
from gtopk_hvd.backend import backend_for
from gtopk_hvd.reductions.result import ReductionStats, SparseResult
from gtopk_hvd.reductions.wait_probe import probe_partner, resolve_wait_probe
from gtopk_hvd.transports import Transport, resolve_transport
from gtopk_hvd.wire import WIRE_VALUE_TYPES, WireFormat

# Message tags of the gTop-k schedule (the communicator is ours alone).
TAG_FOLD_IN, TAG_ROUND, TAG_FOLD_OUT = 11, 12, 13


class GTopkReducer:
    """gTop-k all-reduce state for one (transport, k, index dtype, wire value dtype).

    transport: a Transport, a registered name, or None (MPI over COMM_WORLD).
    The message buffers and the two sets the merges alternate between are allocated once and
    reused by every call: a round merges the received message where it lies into the set the
    previous round did not write. The global set returned is a view of one of them, valid until
    the next call (gtopk_allreduce returns copies). The first call checks, collectively, that
    every worker uses the same k, dtypes and wait probe (a mismatch raises on all).
    wait_probe: precede each message by a zero-byte probe with the same partner, which splits
    stats.comm_seconds into wait_seconds and transfer_seconds (None: GTOPK_HVD_WAIT_PROBE if
    set, else the transport's default: on for MPI; `gtopk_hvd.reductions.wait_probe`).
    """

    def __init__(self, k: int, index_dtype: Any = np.int32, wire_dtype: str = "float32",
                 transport: Transport | str | None = None,
                 wait_probe: bool | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self.k = int(k)
        self.wire = WireFormat(np.dtype(index_dtype), wire_dtype)
        self.transport = transport if isinstance(transport, Transport) else (
            resolve_transport(transport))
        self.wait_probe = resolve_wait_probe(wait_probe, self.transport)
        capacity = self.k * self.wire.entry_bytes
        self._send = np.empty(capacity, dtype=np.uint8)
        self._receive = np.empty(capacity, dtype=np.uint8)
        self._merged = [(np.empty(self.k, dtype=self.wire.index_dtype),
                         np.empty(self.k, dtype=np.float32)) for _ in range(2)]
        self._agreed = False

    # -- public ---------------------------------------------------------------------------

    def allreduce(self, indices: np.ndarray, values: np.ndarray) -> SparseResult:
        """The global top-k set of every worker's local set (see the module docstring)."""
        indices, values = self._checked(indices, values)
        stats = ReductionStats()
        if not self._agreed:
            self._agree_on_parameters()
        current = (indices, self.wire.round_values(values))
        if self.transport.size > 1:
            current = self._schedule(current, stats)
        global_indices, global_values = current
        survived = ops.mark_survivors(indices, global_indices)
        return SparseResult(global_indices, global_values, survived, stats)

    # -- the schedule -----------------------------------------------------------------------

    def _schedule(self, current: tuple[np.ndarray, np.ndarray],
                  stats: ReductionStats) -> tuple[np.ndarray, np.ndarray]:
        """Every worker takes part in every phase (an idle one with no partner), as a
        collective transport needs."""
        rank, size = self.transport.rank, self.transport.size
        base = 1 << (size.bit_length() - 1)  # P'
        folded = size - base  # workers beyond P'
        if folded:
            if rank >= base:
                self._send_set(current, rank - base, TAG_FOLD_IN, stats)
            elif rank < folded:
                received = self._receive_set(rank + base, TAG_FOLD_IN, stats)
                current = self._merge(current, received, stats)
            else:
                self._idle(TAG_FOLD_IN, stats)
        distance = 1
        while distance < base:
            if rank < base:
                received = self._exchange(current, rank ^ distance, stats)
                current = self._merge(current, received, stats)
                stats.rounds += 1
            else:
                self._idle(TAG_ROUND, stats)
            distance <<= 1
        if folded:
            if rank >= base:
                current = self._receive_set(rank - base, TAG_FOLD_OUT, stats)
            elif rank < folded:
                self._send_set(current, rank + base, TAG_FOLD_OUT, stats)
            else:
                self._idle(TAG_FOLD_OUT, stats)
        return current

    def _merge(self, mine: tuple[np.ndarray, np.ndarray], theirs: tuple[np.ndarray, np.ndarray],
               stats: ReductionStats) -> tuple[np.ndarray, np.ndarray]:
        start = time.perf_counter()
        out = self._merged[0]
        # Wire rounding copies the values only: the indices may still be in either buffer.
        if np.may_share_memory(mine[0], out[0]) or np.may_share_memory(mine[1], out[1]):
            out = self._merged[1]
        indices, values = ops.merge_topk(mine[0], mine[1], theirs[0], theirs[1], self.k, out=out)
        # What this worker keeps is what its partners will receive: rounded to the wire dtype.
        merged = indices, self.wire.round_values(values)
        stats.merge_seconds += time.perf_counter() - start
        return merged

    def _probe(self, dest: int | None, source: int | None, tag: int) -> float:
        """The wait before this phase's message (0 without the probe: no extra phase)."""
        if not self.wait_probe:
            return 0.0
        return probe_partner(self.transport, dest, source, tag, self._receive)

    def _exchange(self, current: tuple[np.ndarray, np.ndarray], partner: int,
                  stats: ReductionStats) -> tuple[np.ndarray, np.ndarray]:
        n_bytes = self.wire.pack(current[0], current[1], self._send)
        wait = self._probe(partner, partner, TAG_ROUND)
        start = time.perf_counter()
        received = self.transport.sendrecv(self._send, n_bytes, partner, self._receive, partner,
                                           TAG_ROUND)
        stats.add_exchange(wait, time.perf_counter() - start)
        stats.bytes_sent += n_bytes
        stats.bytes_received += received
        stats.messages_sent += 1
        return self.wire.unpack(self._receive, received)  # merged before the next message

    def _send_set(self, current: tuple[np.ndarray, np.ndarray], dest: int, tag: int,
                  stats: ReductionStats) -> None:
        n_bytes = self.wire.pack(current[0], current[1], self._send)
        wait = self._probe(dest, dest, tag)
        start = time.perf_counter()
        self.transport.sendrecv(self._send, n_bytes, dest, self._receive, None, tag)
        stats.add_exchange(wait, time.perf_counter() - start)
        stats.bytes_sent += n_bytes
        stats.messages_sent += 1

    def _receive_set(self, source: int, tag: int,
                     stats: ReductionStats) -> tuple[np.ndarray, np.ndarray]:
        wait = self._probe(source, source, tag)
        start = time.perf_counter()
        received = self.transport.sendrecv(self._send, 0, None, self._receive, source, tag)
        stats.add_exchange(wait, time.perf_counter() - start)
        stats.bytes_received += received
        return self.wire.unpack(self._receive, received)

    def _idle(self, tag: int, stats: ReductionStats) -> None:
        """A phase without a partner: a no-op on point-to-point transports; on a collective one
        (Horovod's alltoall) this worker still waits for the phase's slowest worker (its probe:
        wait) and for the others' data (transfer)."""
        wait = self._probe(None, None, tag)
        start = time.perf_counter()
        self.transport.sendrecv(self._send, 0, None, self._receive, None, tag)
        stats.add_exchange(wait, time.perf_counter() - start)

    # -- checks -----------------------------------------------------------------------------

    def _checked(self, indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The local set as contiguous arrays. A malformed set is a bug in the caller: with more
        than one worker the job is aborted with the reason (raising on one worker would leave
        the others waiting for its messages forever)."""
        indices = np.ascontiguousarray(indices)
        values = np.ascontiguousarray(values, dtype=np.float32)
        problem = None
        if indices.ndim != 1 or values.ndim != 1 or indices.size != values.size:
            problem = "indices and values must be 1-D and of the same length"
        elif indices.dtype != self.wire.index_dtype:
            problem = f"indices must be {self.wire.index_dtype}, got {indices.dtype}"
        elif indices.size > self.k:
            problem = f"the local set has {indices.size} entries, more than k={self.k}"
        elif indices.size and (indices[0] < 0 or np.any(np.diff(indices) <= 0)):
            problem = "indices must be non-negative and strictly increasing"
        if problem is not None:
            if self.transport.size == 1:
                raise ValueError(problem)
            self.transport.abort(f"gtopk_allreduce: {problem}")
        return indices, values

    def _agree_on_parameters(self) -> None:
        wire_code = WIRE_VALUE_TYPES.index(self.wire.value_type)
        mine = np.array([self.k, self.wire.index_dtype.itemsize, wire_code, self.wait_probe],
                        dtype=np.int64)
        everyone = self.transport.allgather(mine)
        if np.any(everyone != everyone[0]):
            raise ValueError(
                "gtopk_allreduce: workers disagree on (k, index bytes, wire dtype code, wait "
                "probe (GTOPK_HVD_WAIT_PROBE)): "
                + ", ".join(f"rank {r}: {tuple(row)}" for r, row in enumerate(everyone.tolist())))
        self._agreed = True


_reducers: dict[tuple, GTopkReducer] = {}


def gtopk_allreduce(indices: Any, values: Any, k: int, transport: Transport | str | None = None,
                    wire_dtype: str = "float32", wait_probe: bool | None = None) -> SparseResult:
    """gTop-k all-reduce of this worker's index-sorted set of at most k entries.

    Every worker returns the identical global set of at most k entries with summed values,
    plus the mask of its local entries that survived. transport: a Transport, a registered
    name, or None (MPI over COMM_WORLD). Reducers (and their buffers) are cached per
    (transport, k, dtypes, wait probe). wait_probe: see GTopkReducer (result.stats splits
    comm_seconds into wait_seconds and transfer_seconds).
    indices / values may be numpy arrays or torch tensors; for tensors on a GPU only the k-entry
    sets cross to the host, and the global set comes back as tensors on the same device.
    """
    host_indices, host_values = to_host_numpy(indices), to_host_numpy(values)
    transport = resolve_transport(transport)
    wait_probe = resolve_wait_probe(wait_probe, transport)
    key = (id(transport), int(k), np.dtype(host_indices.dtype).str, wire_dtype, wait_probe)
    reducer = _reducers.get(key)
    if reducer is None:
        reducer = _reducers[key] = GTopkReducer(k, host_indices.dtype, wire_dtype, transport,
                                                wait_probe)
    result = reducer.allreduce(host_indices, host_values)
    result.indices, result.values = result.indices.copy(), result.values.copy()  # see reducer
    if framework_of(values) == "torch":
        backend = backend_for(values.device)
        result.indices, result.values = (backend.from_host(result.indices),
                                         backend.from_host(result.values))
    return result
