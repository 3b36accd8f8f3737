"""Horovod's Compressor interface on gtopk_hvd's Compression choices: the adapters' none / fp16
are Horovod's own classes; the framework-neutral DenseCompression runs Horovod's compressor of
the tensor's framework; a sparse choice refuses with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import torch

from gtopk_hvd.compression import Compression as NeutralCompression


def test_adapters_export_horovods_compressors() -> None:
    import horovod.tensorflow as hvd_tf
    import horovod.torch as hvd_torch

    import gtopk_hvd.tensorflow as gtopk_tf
    import gtopk_hvd.tensorflow.keras as gtopk_keras
    import gtopk_hvd.torch as gtopk_torch

    for ours, horovod in ((gtopk_torch, hvd_torch), (gtopk_tf, hvd_tf), (gtopk_keras, hvd_tf)):
        assert ours.Compression.none is horovod.Compression.none
        assert ours.Compression.fp16 is horovod.Compression.fp16
        assert issubclass(ours.Compression.fp16, horovod.compression.Compressor)
        assert ours.Compression.gtopk(0.01) == NeutralCompression.gtopk(0.01)


@pytest.mark.parametrize("name", ["none", "fp16"])
def test_neutral_dense_choices_compress_as_horovod(name: str) -> None:
    import horovod.tensorflow as hvd_tf
    import horovod.torch as hvd_torch

    values = np.linspace(-3, 3, 11, dtype=np.float32)
    ours = getattr(NeutralCompression, name)
    for tensor, horovod in ((torch.from_numpy(values), hvd_torch), (tf.constant(values), hvd_tf)):
        sent, context = ours.compress(tensor)
        expected, expected_context = getattr(horovod.Compression, name).compress(tensor)
        assert np.asarray(sent).tobytes() == np.asarray(expected).tobytes()
        assert np.asarray(sent).dtype == np.asarray(expected).dtype
        back = ours.decompress(sent, context)
        assert np.asarray(back).tobytes() == np.asarray(
            getattr(horovod.Compression, name).decompress(expected, expected_context)).tobytes()
    with pytest.raises(TypeError, match="torch or TensorFlow tensors"):
        ours.compress(values)


def test_sparse_choice_says_why_it_is_not_a_tensor_transform() -> None:
    with pytest.raises(TypeError, match="not a per-tensor transform"):
        NeutralCompression.gtopk(0.01).compress(torch.ones(4))
