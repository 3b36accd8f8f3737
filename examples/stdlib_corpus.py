"""A word-level language-modelling corpus that ships with every Python: the `.py` files at the
top level of the running interpreter's standard library (`sysconfig.get_paths()["stdlib"]`:
about 4.7 MB and 1.1 M tokens, the size of Penn Treebank). Nothing is downloaded.

Tokens: an identifier or keyword, a run of digits, or any other non-space character on its
own; every line ends with `<eos>` (as PTB's sentences do). The vocabulary is the `vocab_size`
most frequent tokens of the training split (ties broken by the token's text) plus `<unk>`, which
stands for every other token. A file goes wholly to one split: valid when
sha256(file name) mod 20 == 18, test when it is 19, train otherwise (about 90 / 5 / 5 per cent of
the tokens; stable across machines and Python patch releases that keep the file names).

The token ids are cached as one .npz under ~/.cache/gtopk_hvd/lm/ (or `cache_dir`), keyed by
the interpreter's version, the files' names and sizes and the vocabulary size; it is written to
a temporary name and renamed, so workers that start together may all build it safely.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import sysconfig
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|\S")
END_OF_LINE = "<eos>"
UNKNOWN = "<unk>"
SPLITS = ("train", "valid", "test")
DEFAULT_CACHE = Path.home() / ".cache" / "gtopk_hvd" / "lm"


@dataclass
class Corpus:
    """Token ids (int32) of each split and the vocabulary (`vocab[id]` is the token)."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    vocab: list[str]


def tokenize(text: str) -> list[str]:
    """The tokens of `text`, line by line, each line followed by <eos>."""
    tokens: list[str] = []
    for line in text.splitlines():
        tokens.extend(TOKEN.findall(line))
        tokens.append(END_OF_LINE)
    return tokens


def split_of(file_name: str) -> str:
    """The split a file belongs to, from a stable hash of its name."""
    bucket = int(hashlib.sha256(file_name.encode()).hexdigest(), 16) % 20
    return "valid" if bucket == 18 else "test" if bucket == 19 else "train"


def stdlib_files() -> list[Path]:
    """The standard library's top-level .py files, sorted by name."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def build_vocab(tokens: Iterable[str], vocab_size: int) -> list[str]:
    """<unk>, <eos>, then the `vocab_size` most frequent other tokens (ties by text)."""
    counts = Counter(token for token in tokens if token not in (UNKNOWN, END_OF_LINE))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:vocab_size]
    return [UNKNOWN, END_OF_LINE, *(token for token, _ in ranked)]


def encode(tokens: Iterable[str], vocab: list[str]) -> np.ndarray:
    ids = {token: index for index, token in enumerate(vocab)}
    return np.fromiter((ids.get(token, 0) for token in tokens), dtype=np.int32)


def _cache_key(files: list[Path], vocab_size: int) -> str:
    digest = hashlib.sha256(f"{sys.version_info[:3]}|{vocab_size}|{TOKEN.pattern}".encode())
    for path in files:
        digest.update(f"|{path.name}:{path.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def _build(files: list[Path], vocab_size: int) -> Corpus:
    tokens: dict[str, list[str]] = {split: [] for split in SPLITS}
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        tokens[split_of(path.name)].extend(tokenize(text))
    vocab = build_vocab(tokens["train"], vocab_size)
    return Corpus(*(encode(tokens[split], vocab) for split in SPLITS), vocab=vocab)


def load_corpus(vocab_size: int = 10_000, cache_dir: Path | None = None) -> Corpus:
    """The standard-library corpus (module docstring), from the cache when it is there."""
    files = stdlib_files()
    if not files:
        raise FileNotFoundError(f"no .py files in {sysconfig.get_paths()['stdlib']}")
    directory = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    path = directory / f"stdlib_{_cache_key(files, vocab_size)}.npz"
    if path.exists():
        with np.load(path) as saved:
            return Corpus(*(saved[split] for split in SPLITS), vocab=list(saved["vocab"]))
    corpus = _build(files, vocab_size)
    directory.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".npz")
    with os.fdopen(handle, "wb") as file:
        np.savez(file, train=corpus.train, valid=corpus.valid, test=corpus.test,
                 vocab=np.array(corpus.vocab))
    os.replace(temporary, path)
    return corpus
