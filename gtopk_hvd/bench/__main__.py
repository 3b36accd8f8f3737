"""python -m gtopk_hvd.bench COMMAND [options]: benchmarks of gtopk_hvd (COMMAND: topk, select,
merge, step, comm, schemes, memory)."""

from __future__ import annotations

import argparse
import importlib

COMMANDS = {"topk": "topk", "select": "selection", "merge": "merge", "step": "step",
            "comm": "comm", "schemes": "schemes", "memory": "memory"}
"""Command -> module of gtopk_hvd.bench (no module is named as a standard one: run as a script,
this folder is first on sys.path)."""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gtopk_hvd.bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    modules = {name: importlib.import_module(f"gtopk_hvd.bench.{module}")
               for name, module in COMMANDS.items()}
    for name, module in modules.items():
        module.add_arguments(commands.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args()
    modules[args.command].run(args)


if __name__ == "__main__":
    main()
