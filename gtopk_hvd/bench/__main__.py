"""python -m gtopk_hvd.bench COMMAND [options]: benchmarks of gtopk_hvd, each printing ratios
measured in one run (the machine's load drifts; ratios drift less). `python -m gtopk_hvd.bench
COMMAND -h` describes a command and shows its options' defaults."""

from __future__ import annotations

import argparse
import importlib

COMMANDS = {"topk": "topk", "select": "selection", "merge": "merge", "step": "step",
            "comm": "comm", "schemes": "schemes", "memory": "memory",
            "fsdp-memory": "fsdp_memory"}
"""Command -> module of gtopk_hvd.bench (no module is named as a standard one: run as a script,
this folder is first on sys.path)."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default shown, the command's docstring kept as written."""


def summary(doc: str) -> str:
    """The docstring's first paragraph on one line: the command's whole one-line summary."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    """The parser of every command (their defaults shown in `-h`), and the command modules."""
    parser = argparse.ArgumentParser(prog="python -m gtopk_hvd.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {name: importlib.import_module(f"gtopk_hvd.bench.{module}")
               for name, module in COMMANDS.items()}
    for name, module in modules.items():
        module.add_arguments(commands.add_parser(
            name, help=summary(module.__doc__), description=module.__doc__,
            formatter_class=HelpFormatter))
    return parser, modules


def main() -> None:
    parser, modules = build_parser()
    args = parser.parse_args()
    modules[args.command].run(args)


if __name__ == "__main__":
    main()
