"""Parameter shapes of well-known models, in the order their modules register them, for the
planner (`python -m gtopk_hvd.plan --params NAME`): DDP's buckets and PowerSGD's matrices need
the shapes, not only their count.

    resnet20   the CIFAR ResNet-20 (He et al. 2016, option A shortcuts)        269,722
    resnet50   torchvision's resnet50                                        25,557,032
    vgg16      torchvision's vgg16                                          138,357,544
    gpt2-350m  Hugging Face's GPT2LMHeadModel at GPT-2 medium's config      354,823,168
               (24 layers, width 1024, vocabulary 50,257, context 1,024; the head tied to
               the embedding, Conv1D weights stored (in, out))
    lstm-lm    examples/pytorch_lm.py at its defaults (2 layers of 256)       3,623,186
    lstm-lm-128  the scale study's LSTM (--size 128)                         1,554,450

Each is checked against the model built from its definition (tests/tools/test_plan_baselines.py). A
model of your own: `json.dump([list(p.shape) for p in model.parameters()], file)` and
`--shapes file`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

Shape = tuple[int, ...]


def _batch_norm(width: int) -> list[Shape]:
    return [(width,), (width,)]


def resnet20() -> list[Shape]:
    shapes: list[Shape] = [(16, 3, 3, 3), *_batch_norm(16)]
    width_in = 16
    for width in (16, 32, 64):
        for _ in range(3):
            shapes += [(width, width_in, 3, 3), *_batch_norm(width),
                       (width, width, 3, 3), *_batch_norm(width)]
            width_in = width
    return shapes + [(10, 64), (10,)]


def resnet50() -> list[Shape]:
    shapes: list[Shape] = [(64, 3, 7, 7), *_batch_norm(64)]
    width_in = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            shapes += [(width, width_in, 1, 1), *_batch_norm(width),
                       (width, width, 3, 3), *_batch_norm(width),
                       (4 * width, width, 1, 1), *_batch_norm(4 * width)]
            if block == 0:
                shapes += [(4 * width, width_in, 1, 1), *_batch_norm(4 * width)]
            width_in = 4 * width
    return shapes + [(1000, 2048), (1000,)]


def vgg16() -> list[Shape]:
    shapes: list[Shape] = []
    width_in = 3
    for width in (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512):
        shapes += [(width, width_in, 3, 3), (width,)]
        width_in = width
    for rows, cols in ((4096, 512 * 7 * 7), (4096, 4096), (1000, 4096)):
        shapes += [(rows, cols), (rows,)]
    return shapes


def gpt2(layers: int = 24, width: int = 1024, vocab: int = 50_257,
         context: int = 1_024) -> list[Shape]:
    shapes: list[Shape] = [(vocab, width), (context, width)]
    for _ in range(layers):
        shapes += [(width,), (width,),  # ln_1
                   (width, 3 * width), (3 * width,), (width, width), (width,),  # attention
                   (width,), (width,),  # ln_2
                   (width, 4 * width), (4 * width,), (4 * width, width), (width,)]  # MLP
    return shapes + [(width,), (width,)]  # ln_f


def lstm_lm(vocab: int = 10_002, size: int = 256, layers: int = 2) -> list[Shape]:
    """examples/pytorch_lm.py's model: the decoder's weight tied to the embedding's."""
    shapes: list[Shape] = [(vocab, size)]
    for _ in range(layers):
        shapes += [(4 * size, size), (4 * size, size), (4 * size,), (4 * size,)]
    return shapes + [(vocab,)]


def gpt_decoder(vocab: int = 5_002, size: int = 128, layers: int = 2,
                context: int = 64) -> list[Shape]:
    """examples/pytorch_transformer.py's decoder (the AdamW study's sizes): the decoder's
    weight tied to the token embedding."""
    shapes: list[Shape] = [(vocab, size), (context, size)]
    for _ in range(layers):
        shapes += [(size,), (size,), (3 * size, size), (3 * size,), (size, size), (size,),
                   (size,), (size,), (4 * size, size), (4 * size,), (size, 4 * size), (size,)]
    return shapes + [(size,), (size,)]


MODELS: dict[str, Callable[[], list[Shape]]] = {
    "resnet20": resnet20, "resnet50": resnet50, "vgg16": vgg16, "gpt2-350m": gpt2,
    "lstm-lm": lstm_lm, "lstm-lm-128": lambda: lstm_lm(size=128),
    "gpt-decoder-study": gpt_decoder}


def count(shapes: list[Shape]) -> int:
    return sum(math.prod(shape) for shape in shapes)


def load(path: str | Path) -> list[Shape]:
    """Shapes from a JSON list of lists of ints (module docstring)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not all(
            isinstance(shape, list) and all(isinstance(n, int) and n > 0 for n in shape)
            for shape in data) or not data:
        raise ValueError(f"{path}: expected a JSON list of shapes (lists of positive ints), "
                         "e.g. json.dump([list(p.shape) for p in model.parameters()], file)")
    return [tuple(shape) for shape in data]
