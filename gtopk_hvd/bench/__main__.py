"""python -m gtopk_hvd.bench {topk} [options]: benchmark commands of gtopk_hvd."""

from __future__ import annotations

import argparse

from gtopk_hvd.bench import topk


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gtopk_hvd.bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    topk.add_arguments(commands.add_parser("topk", help=topk.__doc__.splitlines()[0]))
    args = parser.parse_args()
    {"topk": topk.run}[args.command](args)


if __name__ == "__main__":
    main()
