"""The language-model corpus (examples/stdlib_corpus.py), the LSTM example under mpirun and the
time-to-accuracy script's bookkeeping (scripts/studies/time_to_accuracy.py)."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import margins
from helpers.mpi_launcher import run_mpi

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "examples"), str(REPO / "scripts" / "studies")]

import stdlib_corpus  # noqa: E402
import time_to_accuracy  # noqa: E402


def test_tokenize_splits_words_digits_and_symbols_and_ends_lines() -> None:
    text = "def f(x_1):\n    return x_1+42  # done\n\n"
    assert stdlib_corpus.tokenize(text) == [
        "def", "f", "(", "x_1", ")", ":", "<eos>",
        "return", "x_1", "+", "42", "#", "done", "<eos>", "<eos>"]


def test_vocabulary_is_most_frequent_first_ties_by_text_and_rest_unknown() -> None:
    tokens = ["b", "a", "c", "a", "b", "d", "<eos>", "<eos>", "<eos>"]
    vocab = stdlib_corpus.build_vocab(tokens, vocab_size=2)
    assert vocab == ["<unk>", "<eos>", "a", "b"]
    ids = stdlib_corpus.encode(["a", "c", "<eos>", "b", "zzz"], vocab)
    assert ids.tolist() == [2, 0, 1, 3, 0]


def test_corpus_splits_whole_files_and_is_cached(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = stdlib_corpus.load_corpus(10_000, cache_dir=tmp_path)
    assert len(corpus.vocab) == 10_002 and len(set(corpus.vocab)) == 10_002
    files = stdlib_corpus.stdlib_files()
    splits = [stdlib_corpus.split_of(path.name) for path in files]
    assert {"train", "valid", "test"} == set(splits)
    expected = {split: sum(len(stdlib_corpus.tokenize(path.read_text("utf-8", "replace")))
                           for path, s in zip(files, splits) if s == split)
                for split in ("train", "valid", "test")}
    assert {split: len(getattr(corpus, split)) for split in expected} == expected
    assert expected["train"] > 500_000 and expected["valid"] > 10_000
    unknown = np.mean(corpus.valid == 0)
    assert 0.0 < unknown < 0.1, unknown  # most held-out tokens are in the vocabulary

    def no_rebuild(*_: object) -> None:
        raise AssertionError("the cached corpus was rebuilt")

    monkeypatch.setattr(stdlib_corpus, "_build", no_rebuild)
    again = stdlib_corpus.load_corpus(10_000, cache_dir=tmp_path)
    assert again.vocab == corpus.vocab
    assert all(np.array_equal(getattr(again, s), getattr(corpus, s)) for s in expected)
    with pytest.raises(AssertionError, match="rebuilt"):  # another vocabulary: another entry
        stdlib_corpus.load_corpus(5_000, cache_dir=tmp_path)


@pytest.mark.mpi
@pytest.mark.parametrize("compression", ["none", "gtopk"])
def test_pytorch_lm_learns_with_identical_replicas(compression: str, tmp_path: Path) -> None:
    history_path = tmp_path / "history.json"
    output = run_mpi("examples/pytorch_lm.py", 2, "--compression", compression,
                     "--density", "0.01", "--size", "32", "--max-steps", "8",
                     "--eval-every", "4", "--quiet", "--history", str(history_path),
                     timeout_s=600)
    checksums = re.findall(r"CHECKSUM rank=(\d+) ([0-9a-f]{64})", output)
    assert sorted(int(rank) for rank, _ in checksums) == [0, 1], output[-3000:]
    assert len({digest for _, digest in checksums}) == 1, f"replicas differ: {checksums}"
    history = json.loads(history_path.read_text())
    evaluations = history["evaluations"]
    assert [entry["step"] for entry in evaluations] == [4, 8]
    # An untrained model is about as good as uniform over 10,002 tokens; 8 steps of SGD at
    # lr 20 must have learnt the frequent tokens.
    drop = 1 - evaluations[-1]["valid_perplexity"] / 10_002
    assert drop >= margins.floor(f"lm_{compression}", "perplexity_drop"), evaluations
    assert evaluations[0]["seconds"] < evaluations[1]["seconds"]
    phases = evaluations[-1]["phases"]
    assert phases["compute"] > 0 and phases["transfer"] > 0
    k = math.ceil(0.01 * history["params"])
    if compression == "gtopk":  # one round of k (index, value) pairs at P = 2
        assert phases["select"] > 0 and evaluations[-1]["bytes_per_step"] == 8 * k
    else:  # ring all-reduce: 2 (P - 1) / P of the float32 values
        assert evaluations[-1]["bytes_per_step"] == 4 * history["params"]
    assert math.isfinite(history["test_perplexity"])


def _write_run(out: Path, name: str, steps: list[int], seconds: list[float],
               perplexity: list[float], bytes_per_step: int) -> None:
    phases = dict.fromkeys(time_to_accuracy.PHASES, 0.001)
    entries = [{"step": st, "seconds": se, "valid_perplexity": p, "phases": phases}
               for st, se, p in zip(steps, seconds, perplexity)]
    (out / f"{name}.json").write_text(json.dumps({"evaluations": entries}))
    (out / f"{name}.log").write_text(f"RESULT bytes_per_step={bytes_per_step}\n")


def test_time_to_target_and_speedups_from_histories(tmp_path: Path) -> None:
    _write_run(tmp_path, "lm_dense_100mbit", [10, 20], [40.0, 80.0], [300.0, 200.0], 1000)
    _write_run(tmp_path, "lm_gtopk_0.001_100mbit", [10, 20], [10.0, 20.0], [310.0, 199.0], 8)
    _write_run(tmp_path, "lm_topk_0.001_100mbit", [10, 20], [12.0, 24.0], [320.0, 250.0], 24)
    model = time_to_accuracy.MODELS["lm"]
    runs = time_to_accuracy.load_runs(model, "100mbit", tmp_path)
    assert [run.label for run in runs] == ["dense", "Top-k 0.001", "gTop-k 0.001"]
    dense, topk, gtopk = runs
    assert dense.time_to(model, 200.0) == 80.0 and gtopk.time_to(model, 200.0) == 20.0
    assert topk.time_to(model, 200.0) is None
    assert gtopk.step_seconds == 1.0
    table = time_to_accuracy.report(model, "100mbit", runs)
    assert ("gTop-k 0.001 reached the target in 20.0 s: 4.00x sooner than dense (80.0 s), "
            "Top-k 0.001 never reached it." in table)
    assert "gTop-k 0.01" not in table  # no such run
    _write_run(tmp_path, "lm_gtopk_0.01_100mbit", [10, 20], [10.0, 20.0], [310.0, 201.0], 80)
    table = time_to_accuracy.report(model, "100mbit",
                                    time_to_accuracy.load_runs(model, "100mbit", tmp_path))
    assert "gTop-k 0.01 did not reach the target." in table
    _write_run(tmp_path, "lm_gtopk_0.01_100mbit", [10, 20], [10.0, 20.0], [199.0, 150.0], 80)
    _write_run(tmp_path, "lm_topk_0.01_100mbit", [10, 20], [5.0, 10.0], [199.0, 150.0], 80)
    table = time_to_accuracy.report(model, "100mbit",
                                    time_to_accuracy.load_runs(model, "100mbit", tmp_path))
    assert "2.00x later than Top-k 0.01 (5.0 s)" in table
    assert "| Top-k 0.001 | 250.00 | not reached |" in table
