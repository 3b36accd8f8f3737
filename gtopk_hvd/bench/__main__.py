"""python -m gtopk_hvd.bench {topk,comm} [options]: benchmark commands of gtopk_hvd."""

from __future__ import annotations

import argparse

from gtopk_hvd.bench import comm, topk


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gtopk_hvd.bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (topk, comm):
        name = module.__name__.rsplit(".", 1)[1]
        module.add_arguments(commands.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args()
    {"topk": topk.run, "comm": comm.run}[args.command](args)


if __name__ == "__main__":
    main()
