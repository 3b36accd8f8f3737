"""The sparse-compression options the PyTorch examples share (digits, DDP, the LSTM language
model): --warmup-epochs, --momentum-correction and --no-momentum-masking, and the `Compression`
they ask for together with --compression, --density and --momentum."""

from __future__ import annotations

import argparse
from functools import partial

from gtopk_hvd.compression import DGC_WARMUP, Compression, SparseCompression

SPARSE = {
    "topk": Compression.topk,
    "gtopk": Compression.gtopk,
    "gtopk-exact": partial(Compression.gtopk, exact=True),
    "micro": Compression.micro,
    "exdyna": Compression.exdyna,
    "sketch": Compression.sketch,
    "oktopk": Compression.oktopk,
}
"""The sparse --compression choices and what each asks for."""


def add_sparse_arguments(parser: argparse.ArgumentParser) -> None:
    """--warmup-epochs, --momentum-correction and --no-momentum-masking, read by
    sparse_compression."""
    parser.add_argument("--warmup-epochs", type=float, default=0.0,
                        help="DGC's density warm-up (0.25, 0.0625, 0.015625, 0.004; the "
                             "stages above --density) spread over the first N epochs, for "
                             "every sparse scheme")
    parser.add_argument("--momentum-correction", action="store_true",
                        help="DGC's momentum correction (the momentum moves from SGD into "
                             "the sparsified accumulation), for every sparse scheme")
    parser.add_argument("--no-momentum-masking", dest="momentum_masking", action="store_false",
                        help="with --momentum-correction: keep the velocity where entries are "
                             "sent (1-bit Adam's unbroken momentum) instead of DGC's masking")


def sparse_compression(args: argparse.Namespace, steps_per_epoch: int) -> SparseCompression:
    """--compression (a name in SPARSE) at --density, with the DGC warm-up over --warmup-epochs (its
    densities above --density, in equal stages) and --momentum-correction."""
    factory = SPARSE[args.compression]
    stages = tuple(density for density in DGC_WARMUP if density > args.density)
    stage_steps = round(args.warmup_epochs * steps_per_epoch / len(stages)) if stages else 0
    return factory(density=args.density, warmup_densities=stages,
                   warmup_steps=stage_steps if args.warmup_epochs > 0 else 0,
                   momentum_correction=args.momentum_correction, momentum=args.momentum,
                   momentum_masking=args.momentum_masking)
