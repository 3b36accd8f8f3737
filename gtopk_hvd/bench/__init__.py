"""Benchmarks that print ratios measured in one run: `python -m gtopk_hvd.bench -h`."""
