"""Benchmarks printed as tables of ratios measured in one run (see `python -m gtopk_hvd.bench -h`)."""
