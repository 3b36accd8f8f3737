"""Density control of the threshold schemes (MiCRO, ExDyna): each step's threshold from that
step's own magnitude histogram, summed over workers.

A threshold carried over from the last step misses k by however much the accumulated gradient
moved in between: early in training and on sparse layers (an LM's embedding) that is a factor
of ten either way from one step to the next. So the threshold is measured on the step itself:

    1. in the accumulation pass, each worker counts the magnitudes of its partition in bins
       (`Window`) cut from a float32 magnitude's bits: 1/64 octave (key >> 17) from half an
       octave below the last threshold to half an octave above it, then 1/8 octave (key >> 20)
       up to 4 octaves above, the last bin holding everything higher (the first step: bins of
       1/16 octave over the 20 octaves below the largest |acc| over workers, found by one
       all-gather of one value);
    2. one sum all-reduce of the N_BINS counts: every worker holds the same histogram H of the
       whole gradient;
    3. tau from H for the step's k (below), the same on every worker; if the window holds
       fewer than k entries (tau fell by more than half an octave since the last step), every
       worker counts the 20 octaves below the window too (a read of the partition) and one more
       all-reduce sums them;
    4. the entries with |acc| >= tau: on the host the accumulation pass also kept those at
       or above CANDIDATE_MARGIN x the last threshold, so when tau is not lower than that they
       are picked from those; else (and always on a torch state) a read of the partition
       (ops.threshold_indices), into room for the count this worker's histogram gives from
       tau's bin on (`Window.count_from`).

With C(b) = the count at or above bin b's lower edge:

    C(last) >= k:  tau = the last bin's lower edge     (more than k far above: take them)
    C(0)   <  k:   tau = the lowest edge               (fewer than k in the window: take them)
    otherwise:     b = the highest bin with C(b) >= k, lo and hi its edges, tau = lo (hi/lo)^u:
                   a tail (C falls across bin b at most as the square of how it fell across
                   bin b - 1): C is taken as a power of the magnitude inside the bin (exact for
                   power-law tails, nearly so for Gaussian ones),
                       u = (log C(b) - log k) / (log C(b) - log C(b+1));
                   a cut (C falls much faster, or to 0: the top was taken at the last step and
                   little came back): the density inside bin b is taken to fall at the rate it
                   fell from bin b - 1, s = log(H(b-1) / H(b)), and u solves
                       e^(-s u) = e^(-s) + (k - C(b+1)) / H(b) (1 - e^(-s))

So the count misses k only by the shape of C inside one bin of 1/64 octave. Cost: the count in
the accumulation pass (only entries at or above the lowest edge are counted), one all-reduce of
N_BINS float32 values, and a read of the partition only where tau fell by more than
CANDIDATE_MARGIN. The authors' rule (kljp/micro) is kept as
"multiplicative", for comparison: one pass with the carried threshold; ratio = selected / k;
ratio > 1.1: tau x 1.005; ratio < 1/1.1: tau x 0.995; else tau x 1.00125.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gtopk_hvd.ops import histogram_count_from, magnitude_key, value_of_key

FINE_SHIFT = 17  # 1/64 octave
COARSE_SHIFT = 20  # 1/8 octave
FINE_BELOW = 32  # fine bins below the last threshold's: half an octave
N_FINE = 64  # half an octave below to half an octave above
N_COARSE = 28  # 3.5 octaves more above
N_BINS = N_FINE + N_COARSE + 1  # the last counts everything higher
START_SHIFT = 19  # the first step and a second look: 1/16 octave
START_BINS = 320  # 20 octaves
CANDIDATE_MARGIN = 2 ** -0.25  # a quarter octave below the last threshold
NO_KEY = 0xFFFFFFFF  # above every float32 key: the accumulation pass selects nothing
CONTROLLERS = ("histogram", "multiplicative")
SMALLEST_THRESHOLD = float(np.finfo(np.float32).tiny)
MAX_DECAY = 5.0


@dataclass(frozen=True)
class Window:
    """The bins of one histogram: n_fine bins of 2^shift keys from base_key, then bins of
    2^coarse_shift keys, n_bins in all, the last open above (`ops.histogram_bin`)."""

    base_key: int
    shift: int
    n_bins: int
    n_fine: int
    coarse_shift: int = 0

    def edge(self, b: int) -> float:
        """The lower edge (a magnitude) of bin b."""
        if b <= self.n_fine:
            key = self.base_key + (b << self.shift)
        else:
            key = self.base_key + (self.n_fine << self.shift) + (
                (b - self.n_fine) << self.coarse_shift)
        return value_of_key(min(key, 0x7F800000))

    def count_from(self, histogram: np.ndarray, key: int) -> int | None:
        """A bound of the entries with magnitude key >= `key` among those this window's
        `histogram` counted: its bins from key's on (`ops.histogram_count_from`); None below
        the window."""
        return histogram_count_from(histogram, self.base_key, self.shift, self.n_bins, key,
                                    self.n_fine, self.coarse_shift)

    def kernel_arguments(self) -> dict:
        """The histogram's arguments of `ops.accumulate_threshold`."""
        return {"histogram_base_key": self.base_key, "histogram_shift": self.shift,
                "n_bins": self.n_bins, "n_fine": self.n_fine, "coarse_shift": self.coarse_shift}


def window_around(tau: float) -> Window:
    """The histogram of a step whose last threshold was `tau`."""
    floor = (magnitude_key(tau) >> FINE_SHIFT) << FINE_SHIFT
    return Window(max(0, floor - (FINE_BELOW << FINE_SHIFT)), FINE_SHIFT, N_BINS, N_FINE,
                  COARSE_SHIFT)


def window_under(top: float) -> Window:
    """The 20 octaves below the magnitude `top` (the first step: the largest |acc|; a second
    look: the lowest edge of the window that held fewer than k), in bins of 1/16 octave."""
    floor = (magnitude_key(max(top, SMALLEST_THRESHOLD)) >> START_SHIFT) << START_SHIFT
    base = max(0, floor - (START_BINS << START_SHIFT))
    return Window(base, START_SHIFT, START_BINS + 2, START_BINS + 2)


def from_histogram(histogram: np.ndarray, window: Window, k: int) -> float:
    """The threshold that passes k entries of the histogram (module docstring), float32."""
    above = np.cumsum(np.asarray(histogram, np.float64)[::-1])[::-1]  # C(b)
    last = len(histogram) - 1
    if above[last] >= k:
        tau = window.edge(last)
    elif above[0] < k:
        tau = window.edge(0)
    else:
        b = int(np.nonzero(above >= k)[0][-1])
        lo, hi = max(window.edge(b), SMALLEST_THRESHOLD), window.edge(b + 1)
        falls_here = above[b] / above[b + 1] if above[b + 1] > 0 else math.inf
        falls_below = above[b - 1] / above[b] if b > 0 else 1.0
        if falls_here <= falls_below ** 2:  # a tail: C a power of the magnitude inside bin b
            position = (math.log(above[b]) - math.log(k)) / math.log(falls_here)
        else:  # the top of the distribution is cut inside bin b
            position = cut_position((k - above[b + 1]) / histogram[b],
                                    histogram[b - 1] if b > 0 else histogram[b], histogram[b])
        tau = math.exp(math.log(lo) + position * (math.log(hi) - math.log(lo)))
    return float(np.float32(max(tau, SMALLEST_THRESHOLD)))


def cut_position(share: float, below: float, here: float) -> float:
    """Where in a bin (0: its lower edge, 1: its upper) `share` of its entries lie above, if
    its density in log-magnitude falls at the rate it fell from the bin below, s = log(below /
    here): e^(-s u) = e^(-s) + share (1 - e^(-s))."""
    decay = min(max(math.log(max(below, 1) / max(here, 1)), -MAX_DECAY), MAX_DECAY)
    if abs(decay) < 1e-6:
        return 1.0 - share
    return -math.log(math.exp(-decay) + share * (1 - math.exp(-decay))) / decay


def multiplicative(threshold: float, selected: int, k: int) -> float:
    """The authors' rule (module docstring), as a float32 value."""
    ratio = selected / k
    factor = 1.005 if ratio > 1.1 else 0.995 if ratio < 1 / 1.1 else 1.00125
    return float(np.float32(max(threshold * factor, SMALLEST_THRESHOLD)))
