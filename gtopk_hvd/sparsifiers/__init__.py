"""Selection rules of error-feedback sparsification, registered by name (`SPARSIFIERS`):

    "topk"     the k largest magnitudes (topk.py); Top-k and gTop-k S-SGD
    "randomk"  k indices from a generator seeded alike on every worker (randomk.py)
"""

from gtopk_hvd.sparsifiers import randomk, topk  # noqa: F401  (registration)
from gtopk_hvd.sparsifiers.base import SPARSIFIERS, Sparsifier

__all__ = ["SPARSIFIERS", "Sparsifier"]
