"""Every option of every choice is checked when the choice is made: its type, its
range, whether the scheme has it, and combinations that mean nothing; each message names the
option, the value, what is allowed and the fix. Each scheme has one name on every surface."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from gtopk_hvd import plan
from gtopk_hvd.arguments import parse_arguments
from gtopk_hvd.bench import schemes as bench_schemes
from gtopk_hvd.compression import DGC_WARMUP, SCHEME_NAMES, Compression, SparseCompression
from gtopk_hvd.core.warmup_warning import density_warning_text
from gtopk_hvd.options import OptionError, OptionTypeError
from gtopk_hvd.schemes import known_scheme_names

ROOT = Path(__file__).resolve().parents[2]


def refused(error: type[Exception], call, *parts: str) -> str:
    """Runs call(), which must raise `error` whose message holds every one of `parts`
    (literally); returns the message."""
    with pytest.raises(error) as caught:
        call()
    text = str(caught.value)
    assert text.startswith("gtopk_hvd: "), text
    for part in parts:
        assert part in text, (part, text)
    return text


# -- types and ranges --------------------------------------------------------------------------

@pytest.mark.parametrize("value, shown", [("0.01", "str '0.01'"), (True, "bool True"),
                                          (None, "NoneType None"), ([0.1], "list [0.1]")])
def test_a_density_of_the_wrong_type_is_a_type_error(value: object, shown: str) -> None:
    refused(TypeError, lambda: Compression.gtopk(density=value),
            f"density must be a number in (0, 1], got {shown}", "e.g. density=0.01")
    assert issubclass(OptionTypeError, ValueError)  # what earlier versions raised


@pytest.mark.parametrize("call, parts", [
    (lambda: Compression.gtopk(0.0), ("density must be a number in (0, 1]", "got float 0.0")),
    (lambda: Compression.gtopk(float("nan")), ("density", "got float nan")),
    (lambda: Compression.gtopk(0.1, momentum=1.0),
     ("momentum must be a number in [0, 1)", "got float 1.0")),
    (lambda: Compression.gtopk(0.1, warmup_steps=-1),
     ("warmup_steps must be an integer >= 0", "got int -1")),
    (lambda: Compression.gtopk(0.1, wire_dtype="float64"),
     ("wire_dtype must be one of 'float32', 'float16', 'bfloat16'", "got str 'float64'")),
    (lambda: Compression.gtopk(0.1, granularity="layer"),
     ("granularity must be one of 'model', 'bucket'", "got str 'layer'", "selection=")),
    (lambda: Compression.topk(0.1, nonfinite="ignore"),
     ("nonfinite must be one of 'propagate', 'raise'", "got str 'ignore'")),
    (lambda: Compression.sparse(0.1, sparsifier="randomk", seed=-1),
     ("seed must be an integer >= 0", "got int -1")),
])
def test_a_value_out_of_range_is_a_value_error_naming_option_value_and_allowed(
        call, parts: tuple[str, ...]) -> None:
    with pytest.raises(OptionError):
        call()
    refused(ValueError, call, *parts)


@pytest.mark.parametrize("call, parts", [
    (lambda: Compression.gtopk(0.1, warmup_steps=2.5), ("warmup_steps", "got float 2.5")),
    (lambda: Compression.gtopk(0.1, momentum_correction="yes"),
     ("momentum_correction must be True or False", "got str 'yes'")),
    (lambda: Compression.gtopk(0.1, exact=1), ("exact must be True or False", "got int 1")),
    (lambda: Compression.gtopk(0.1, warmup_densities=0.25, warmup_steps=3),
     ("warmup_densities must be a tuple of densities", "got float 0.25", "DGC_WARMUP")),
    (lambda: Compression.gtopk(0.1, wire_dtype=16), ("wire_dtype", "got int 16")),
    (lambda: Compression.sparse(0.1, sparsifier=3), ("sparsifier", "got int 3")),
    (lambda: Compression.sketch(0.1, second_round="no"),
     ("second_round must be True or False", "got str 'no'")),
    (lambda: Compression.micro(0.1, threshold="1"),
     ("threshold must be a finite number > 0 or None", "got str '1'")),
    (lambda: Compression.exdyna(0.1, blocks=1024.0),
     ("blocks must be an integer >= 1", "got float 1024.0")),
])
def test_a_value_of_the_wrong_type_is_a_type_error(call, parts: tuple[str, ...]) -> None:
    refused(TypeError, call, *parts)


# -- refused when made, not when a step is built ------------------------------------------------

@pytest.mark.parametrize("call, error, parts", [
    (lambda: Compression.scheme("nope", 0.01), ValueError,
     ("scheme must be one of 'gtopk', 'gtopk-exact', 'topk', 'randomk', 'micro', 'exdyna', "
      "'sketch'", "got str 'nope'", "Compression.scheme(name, density")),
    (lambda: Compression.micro(0.01, blocks=-3), TypeError,
     ("Compression.micro has no option blocks (got blocks=-3)",
      "the options of scheme 'micro' are: threshold, controller",
      "blocks is an option of exdyna: Compression.exdyna(density, blocks=-3)")),
    (lambda: Compression.micro(0.01, granularity="bucket"), ValueError,
     ("granularity must be 'model' for scheme 'micro'", "got str 'bucket'",
      "leave granularity out")),
    (lambda: Compression.exdyna(0.01, wire_dtype="bfloat16"), ValueError,
     ("wire_dtype must be 'float32' for scheme 'exdyna'", "got str 'bfloat16'")),
    (lambda: Compression.sketch(0.01, rows=0), ValueError,
     ("rows must be an integer >= 1", "got int 0", "default 5")),
    (lambda: Compression.sketch(0.01, columns=-1), ValueError,
     ("columns must be an integer >= 1", "got int -1", "10 k")),
    (lambda: Compression.exdyna(0.01, balance=1.5), ValueError,
     ("balance must be a number in [0, 1)", "got float 1.5")),
    (lambda: Compression.micro(0.01, controller="pid"), ValueError,
     ("controller must be one of 'histogram', 'multiplicative'", "got str 'pid'")),
    (lambda: Compression.gtopk(0.01, blocks=3), TypeError,
     ("Compression.gtopk has no option blocks (got blocks=3)", "its options are: exact",
      "Compression.exdyna(density, blocks=3)")),
    (lambda: Compression.sketch(0.01, threshold=2.0), TypeError,
     ("Compression.sketch has no option threshold", "rows, columns, second_round",
      "Compression.micro(density, threshold=2.0)")),
    (lambda: Compression.sparse(0.1, sparsifier="nope"), ValueError,
     ("sparsifier must be one of 'randomk', 'topk'", "got str 'nope'")),
    (lambda: Compression.sparse(0.1, reduction="ring"), ValueError,
     ("reduction must be one of 'allgather', 'allreduce', 'gtopk'", "got str 'ring'")),
])
def test_what_was_refused_only_when_a_step_was_built_is_refused_when_made(
        call, error: type[Exception], parts: tuple[str, ...]) -> None:
    refused(error, call, *parts)


@pytest.mark.parametrize("call, parts", [
    (lambda: Compression.topk(0.01, exact=True),
     ("exact must be left out of Compression.topk", "got bool True",
      "Compression.gtopk(density, exact=True)")),
    (lambda: Compression.scheme("randomk", 0.01, exact=True), ("exact", "random-k's all-reduce")),
    (lambda: Compression.sparse(0.01, reduction="allgather", exact=True),
     ("exact must be False with the 'allgather' reduction", "got bool True")),
    (lambda: Compression.gtopk(0.01, scheme="micro"),
     ("scheme must be left out of Compression.gtopk", "got str 'micro'",
      "for 'micro' use Compression.micro(density, ...)")),
    (lambda: Compression.topk(0.01, reduction="gtopk"),
     ("reduction must be left out of Compression.topk", "got str 'gtopk'", "Compression.sparse")),
    (lambda: Compression.gtopk(0.01, sparsifier="randomk"),
     ("sparsifier must be left out of Compression.gtopk", "got str 'randomk'")),
    (lambda: Compression.micro(0.01, exact=True),
     ("exact must be left at its default (False) for scheme 'micro'", "got bool True")),
    (lambda: Compression.sketch(0.01, sparsifier="randomk"),
     ("sparsifier must be left at its default ('topk') for scheme 'sketch'",)),
    (lambda: Compression.micro(0.01, scheme="sketch"),
     ("scheme must be left out of Compression.micro", "got str 'sketch'")),
    (lambda: Compression.sparse(0.01, scheme="micro"),
     ("scheme must be left out of Compression.sparse", "Compression.scheme('micro'")),
    (lambda: Compression.scheme("gtopk-exact", 0.01, exact=False),
     ("exact must be left out of Compression.scheme('gtopk-exact', ...)",)),
    (lambda: Compression.sparse(0.1, sparsifier="topk", reduction="allreduce"),
     ("reduction must be one that sends indices", "got str 'allreduce'")),
    (lambda: Compression.gtopk(0.1, granularity="bucket", selection="model"),
     ("give granularity= or its older name selection=, not both",)),
])
def test_combinations_that_mean_nothing_are_refused_not_ignored(
        call, parts: tuple[str, ...]) -> None:
    refused(ValueError, call, *parts)


# -- every documented option still constructs ---------------------------------------------------

COMMON = dict(wire_dtype="float32", warmup_densities=DGC_WARMUP, warmup_steps=10,
              momentum_correction=True, momentum=0.5, seed=3, nonfinite="raise")


@pytest.mark.parametrize("call", [
    lambda: Compression.topk(0.01, granularity="bucket", **COMMON),
    lambda: Compression.topk(0.01, selection="bucket", wire_dtype="float32"),
    lambda: Compression.gtopk(0.01, exact=True, granularity="bucket", **COMMON),
    lambda: Compression.gtopk(0.01, wire_dtype="bfloat16"),
    lambda: Compression.gtopk(0.01, wire_dtype="float16", exact=False),
    lambda: Compression.sparse(0.01, sparsifier="randomk", reduction="allreduce", **COMMON),
    lambda: Compression.sparse(0.01, sparsifier="randomk", reduction="gtopk", exact=True),
    lambda: Compression.sparse(0.01, sparsifier="topk", reduction="allgather"),
    lambda: Compression.micro(0.01, threshold=0.5, controller="multiplicative", **COMMON),
    lambda: Compression.exdyna(0.01, threshold=1e-3, controller="histogram", blocks=64,
                               balance=0.0, **COMMON),
    lambda: Compression.sketch(0.01, rows=3, columns=1000, second_round=False, **COMMON),
    lambda: Compression.scheme("select-reduce", 0.01, sparsifier="randomk"),
    *[lambda name=name: Compression.scheme(name, 0.01, **COMMON) for name in SCHEME_NAMES],
])
def test_every_documented_option_of_every_scheme_constructs(call) -> None:
    config = call()
    assert isinstance(config, SparseCompression)
    assert eval(repr(config), {"Compression": Compression}) == config  # noqa: S307


# -- one name per scheme -----------------------------------------------------------------------

@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_each_scheme_has_one_name_that_it_takes_and_prints(name: str) -> None:
    config = Compression.scheme(name, 0.01)
    assert config.name == name
    assert repr(config).startswith(f"Compression.scheme({name!r}, 0.01")


def test_the_methods_make_the_same_configuration_as_their_names() -> None:
    assert Compression.scheme("gtopk", 0.01) == Compression.gtopk(0.01)
    assert Compression.scheme("gtopk-exact", 0.01) == Compression.gtopk(0.01, exact=True)
    assert Compression.scheme("topk", 0.01) == Compression.topk(0.01)
    assert Compression.scheme("randomk", 0.01) == Compression.sparse(0.01, sparsifier="randomk")
    for name in ("micro", "exdyna", "sketch", "oktopk"):
        assert Compression.scheme(name, 0.01) == getattr(Compression, name)(0.01)
    # the registered family's name is an alias of Compression.sparse, printed by the scheme's name
    assert Compression.scheme("select-reduce", 0.01) == Compression.gtopk(0.01)
    assert Compression.sparse(0.01, reduction="allgather").name == "topk"
    # micro runs MiCRO and says so (it used to print reduction='gtopk' when asked through gtopk)
    assert "micro" in repr(Compression.micro(0.01)) and "reduction" not in repr(
        Compression.micro(0.01))


def test_the_planner_bench_and_docs_use_the_same_names() -> None:
    names = {"dense", *known_scheme_names()}  # the shipped ones and any a test registered
    assert set(SCHEME_NAMES) <= names
    assert set(plan.configurations()) <= names
    assert set(bench_schemes.configurations()) <= names
    for name, make in bench_schemes.configurations().items():
        assert make is None or make(0.01).name == name
    schemes_md = (ROOT / "docs" / "schemes.md").read_text()
    for name in SCHEME_NAMES:
        assert f"`{name}`" in schemes_md, name


def test_the_warmup_warning_names_what_is_missing() -> None:
    text = density_warning_text(Compression.gtopk(0.001, warmup_steps=100))
    assert "warmup_steps=100 but no warmup_densities" in text and "warmup_steps=0" not in text
    text = density_warning_text(Compression.gtopk(0.001, warmup_densities=(0.1,)))
    assert "warmup_densities=(0.1,) but warmup_steps=0" in text
    assert "warmup_steps=0 and no warmup_densities" in density_warning_text(
        Compression.gtopk(0.001))


# -- the DDP hook and the optimizers' arguments -------------------------------------------------

def test_the_hook_state_says_what_serves_nccl_and_names_every_sparse_choice() -> None:
    pytest.importorskip("torch")
    from gtopk_hvd.torch.ddp import GTopkHookState

    text = refused(ValueError, lambda: GTopkHookState(transport="nccl"),
                   "transport must be None (the default: torch.distributed over the process "
                   "group), 'torch', 'mpi', 'horovod' or a gtopk_hvd Transport",
                   "got str 'nccl'", "transport=\"torch\" (or None, the default)",
                   "backend='nccl'")
    assert "local" not in text.split(";")[0], text
    refused(ValueError, lambda: GTopkHookState(transport="local"), "got str 'local'",
            "cannot serve")
    refused(TypeError, lambda: GTopkHookState(transport=3), "got int 3")
    text = refused(TypeError, lambda: GTopkHookState(compression=Compression.fp16),
                   "compression must be a sparse choice", "got DenseCompression")
    for choice in (".micro", ".exdyna", ".sketch", ".sparse", ".topk", ".scheme"):
        assert choice in text, (choice, text)
    refused(ValueError, lambda: GTopkHookState(start_iter=1), "start_iter must be an integer >= 2",
            "got int 1")
    refused(TypeError, lambda: GTopkHookState(start_iter=2.5), "got float 2.5")
    refused(TypeError, lambda: GTopkHookState(density="0.1"), "density", "got str '0.1'")
    refused(TypeError, lambda: GTopkHookState(blocks=4), "GTopkHookState has no option blocks")


def fake_horovod() -> types.SimpleNamespace:
    """What parse_arguments reads of a Horovod module."""
    return types.SimpleNamespace(__name__="horovod.torch", Average="Average", Sum="Sum",
                                 Adasum="Adasum", global_process_set="global")


def test_the_optimizer_arguments_are_checked_with_the_same_messages() -> None:
    hvd = fake_horovod()
    text = refused(TypeError, lambda: parse_arguments(hvd, "gtopk"), "compression must be",
                   "got str 'gtopk'")
    for choice in (".gtopk(density)", ".micro(density)", ".exdyna(density)", ".sketch(density)",
                   ".scheme(name, density)"):
        assert choice in text, (choice, text)
    refused(ValueError, lambda: parse_arguments(hvd, Compression.gtopk(0.1),
                                                backward_passes_per_step=0),
            "backward_passes_per_step must be an integer >= 1", "got int 0")
    refused(TypeError, lambda: parse_arguments(hvd, Compression.gtopk(0.1),
                                               gradient_predivide_factor="2"),
            "gradient_predivide_factor must be a number > 0", "got str '2'")
    assert parse_arguments(hvd, Compression.gtopk(0.1)).average


# -- bench help --------------------------------------------------------------------------------

def bench_help(*command: str) -> str:
    result = subprocess.run([sys.executable, "-m", "gtopk_hvd.bench", *command, "-h"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_bench_help_gives_whole_summaries_and_every_default() -> None:
    from gtopk_hvd.bench.__main__ import COMMANDS, build_parser, summary

    _, modules = build_parser()
    top = re.sub(r"\s+", " ", bench_help())
    for name in COMMANDS:
        line = summary(modules[name].__doc__)
        assert line.endswith("."), line
        assert line in top, (line, top)
    topk = bench_help("topk")
    for option in ("--sizes", "--densities", "--repeats", "--torch-repeats", "--device"):
        block = topk[topk.index(f"\n  {option}"):]
        assert "(default:" in block[1:].split("\n  --")[0], (option, topk)
    assert "hint ms" in topk and "threshold_hint" in topk
    for name in COMMANDS:
        text = bench_help(name)
        options = [line for line in text.splitlines() if line.strip().startswith("--")]
        assert options and "(default:" in text, (name, text)
