"""What we recommend, in one place: the configuration to start from with SGD and with AdamW.

README.md, docs/schemes.md and docs/adamw.md quote `Recommendation.text()` verbatim and the
planner prints it beside its own pick; tests/docs/test_recommendation.py holds them to this module,
and this module to the planner's pick on the measured runs at `CANONICAL` (the planner's arguments
for the case it was picked at). A recommendation names its configuration as the convergence runs
name it (`gtopk_hvd.convergence.Run.name`): `<scheme>_<density>` for the scale study's,
`<scheme>-<density>-preconditioned-dense<N>` for the transformer's (AdamW's second moment frozen
after N dense steps, `freeze_variance_after=N`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gtopk_hvd import convergence


@dataclass(frozen=True)
class Recommendation:
    """A configuration: the scheme, its density and the step's options, for one optimizer."""

    optimizer: str  # "SGD" or "AdamW"
    config: str  # the measured runs' name for it
    convergence: str  # the runs it was picked on: a shipped table's name or a source folder

    def text(self) -> str:
        """The sentence the docs quote."""
        return f"With {self.optimizer}: `{call(self.config)}`"


def call(config: str) -> str:
    """The code a configuration's name stands for (module docstring): the compression and the
    step's options, or the DDP hook a baseline is."""
    if config == "dense":
        return "dense (DDP's own all-reduce)"
    if config == "bf16":
        return "DDP's bf16_compress_hook"
    if match := re.fullmatch(r"powersgd-r(\d+)(?:-epochs(\d+))?", config):
        return (f"DDP's powerSGD_hook, matrix_approximation_rank={match[1]}"
                + (f", {match[2]} epochs" if match[2] else ""))
    if match := re.fullmatch(r"([a-z-]+?)_([0-9.e-]+)", config):
        return f"compression={compression(match[1], match[2])}"
    if match := re.fullmatch(r"([a-z-]+?)-([0-9.]+)-preconditioned-dense(\d+)(-.*)?", config):
        return (f"compression={compression(match[1], match[2])}, "
                f"freeze_variance_after={match[3]}")
    return config


def compression(scheme: str, density: str) -> str:
    """`Compression.<scheme>(density)`, or `Compression.scheme(name, density)` for a name that
    is no identifier."""
    if scheme.isidentifier():
        return f"Compression.{scheme}({density})"
    return f"Compression.scheme({scheme!r}, {density})"


SGD = Recommendation("SGD", "oktopk_0.01", convergence.DEFAULT_TABLE)
ADAMW = Recommendation("AdamW", "powersgd-r4-epochs4", "results/adamw/per_worker8")
ALL = (SGD, ADAMW)

CANONICAL = {  # the case each was picked at: P = 32, 1 Gbit/s, a GPU's compute for the model
    "SGD": ["--params", "lstm-lm-128", "--workers", "32", "--link", "1gbit", "--compute-ms",
            "2.8", "--near", "1.02"],
    "AdamW": ["--params", "gpt-decoder-study", "--workers", "32", "--link", "1gbit",
              "--compute-ms", "4", "--near", "1.02"],
}
