"""Density control of the threshold schemes (MiCRO, ExDyna): each step's threshold from that
step's own magnitude histogram, summed over workers.

A threshold carried over from the last step misses k by however much the accumulated gradient
moved in between: early in training and on sparse layers (an LM's embedding) that is a factor
of ten either way from one step to the next. So the threshold is measured on the step itself:

    1. in the accumulation pass, each worker counts the magnitudes of its partition in bins of
       1/16 octave (a float32 magnitude's exponent and top 4 mantissa bits: key >> 19), from
       half an octave (BINS_BELOW) below the last threshold's bin to 4 octaves above it, the
       last bin holding everything higher (the first step: the 20 octaves below the largest
       |acc| over workers, one all-gather of one value);
    2. one sum all-reduce of the N_BINS counts: every worker holds the same histogram H of the
       whole gradient;
    3. tau from H for the step's k (below), the same on every worker; if the window holds
       fewer than k entries (tau fell by more than half an octave since the last step), every
       worker counts the 20 octaves below the window too (a read of the partition) and one more
       all-reduce sums them;
    4. the entries with |acc| >= tau: the accumulation pass also kept those at or above
       CANDIDATE_MARGIN x the last threshold, so when tau is not lower than that they are
       picked from those; else a read of the partition (ops.threshold_indices).

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

So the count misses k only by the shape of C inside one bin of 1/16 octave. Cost: the count in
the accumulation pass (only entries at or above the lowest edge are counted), one all-reduce of
N_BINS float32 values, and a read of the partition only where tau fell by more than
CANDIDATE_MARGIN. The authors' rule (kljp/micro) is kept as
"multiplicative", for comparison: one pass with the carried threshold; ratio = selected / k;
ratio > 1.1: tau x 1.005; ratio < 1/1.1: tau x 0.995; else tau x 1.00125.
"""

from __future__ import annotations

import math

import numpy as np

from gtopk_hvd.ops import magnitude_key, value_of_key

HISTOGRAM_SHIFT = 19
BINS_BELOW = 8
BINS_ABOVE = 64
N_BINS = BINS_BELOW + BINS_ABOVE + 1
START_BINS = 320  # the first step: 20 octaves below the largest |acc|
CANDIDATE_MARGIN = 2 ** -0.25  # a quarter octave below the last threshold
NO_KEY = 0xFFFFFFFF  # above every float32 key: the accumulation pass selects nothing
CONTROLLERS = ("histogram", "multiplicative")
SMALLEST_THRESHOLD = float(np.finfo(np.float32).tiny)
MAX_DECAY = 5.0


def bin_floor(key: int) -> int:
    """The lower edge (a key) of the bin holding `key`."""
    return (key >> HISTOGRAM_SHIFT) << HISTOGRAM_SHIFT


def window_below(tau: float) -> int:
    """The lowest edge (a key) of the histogram around the last threshold `tau`."""
    return max(0, bin_floor(magnitude_key(tau)) - (BINS_BELOW << HISTOGRAM_SHIFT))


def window_under(largest: float) -> int:
    """The lowest edge (a key) of the first step's histogram, under the largest |acc|."""
    top = bin_floor(magnitude_key(max(largest, SMALLEST_THRESHOLD)))
    return max(0, top - (START_BINS << HISTOGRAM_SHIFT))


def edge(base_key: int, b: int) -> float:
    """The lower edge (a magnitude) of bin b of the histogram that starts at base_key."""
    return value_of_key(base_key + (b << HISTOGRAM_SHIFT))


def from_histogram(histogram: np.ndarray, base_key: int, k: int) -> float:
    """The threshold that passes k entries of the histogram (module docstring), float32."""
    above = np.cumsum(np.asarray(histogram, np.float64)[::-1])[::-1]  # C(b)
    last = len(histogram) - 1
    if above[last] >= k:
        tau = edge(base_key, last)
    elif above[0] < k:
        tau = edge(base_key, 0)
    else:
        b = int(np.nonzero(above >= k)[0][-1])
        lo, hi = max(edge(base_key, b), SMALLEST_THRESHOLD), edge(base_key, b + 1)
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
