"""The planner's baselines: the bucket pipeline's arithmetic, DDP's buckets and PowerSGD's wire
as the planner prices them, the named models' shapes against the models themselves, the
selection time of the device named, one recommendation per P, and the convergence table shipped
in the package equal to the study's histories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gtopk_hvd import convergence, ddp_wire, model_shapes, plan
from gtopk_hvd.bench import devices, pipeline


def test_pipeline_without_overlap_is_compute_plus_every_bucket() -> None:
    assert pipeline.pipelined_step(0.3, [0.1, 0.2, 0.05], [10, 20, 30], overlap=0.0) == (
        pytest.approx(0.3 + 0.35))


def test_pipeline_with_full_overlap_hides_all_but_the_last_bucket() -> None:
    # forward 0.1, backward 0.2: bucket 1 ready at 0.2 (half the values), bucket 2 at 0.3
    step = pipeline.pipelined_step(0.3, [0.05, 0.04], [50, 50], overlap=1.0,
                                   backward_share=2 / 3)
    assert step == pytest.approx(0.3 + 0.04)
    # a first bucket longer than the rest of backward delays the second
    step = pipeline.pipelined_step(0.3, [0.15, 0.04], [50, 50], overlap=1.0,
                                   backward_share=2 / 3)
    assert step == pytest.approx(0.2 + 0.15 + 0.04)


def test_pipeline_at_half_the_rate_while_compute_runs() -> None:
    # bucket 1 ready at 0.2 needs 0.1 of link work: 0.05 of it by 0.3 at half rate, 0.05 after
    step = pipeline.pipelined_step(0.3, [0.1, 0.02], [50, 50], overlap=0.5,
                                   backward_share=2 / 3)
    assert step == pytest.approx(0.3 + 0.05 + 0.02)
    with pytest.raises(ValueError, match="overlap"):
        pipeline.pipelined_step(0.3, [0.1], [1], overlap=1.5)


def test_the_baselines_bytes_are_the_hooks_wire() -> None:
    """Dense and bf16: a ring all-reduce of d values at 4 and 2 bytes; PowerSGD: what the
    simulated cluster's PowerSGD, checked against powerSGD_hook under torchrun, reports."""
    from gtopk_hvd.torch.ddp_baselines import Bf16Allreduce, PowerSGD

    shapes = model_shapes.resnet20()
    d = model_shapes.count(shapes)
    model = plan.Model(d, shapes)
    for workers in (2, 8, 32):
        dense = plan.predict_baseline("dense", workers, model, 1e9, 0.0, 0.1, 1.0)
        assert dense.bytes_sent == pytest.approx(2 * (workers - 1) / workers * 4 * d, abs=8)
        bf16 = plan.predict_baseline("bf16", workers, model, 1e9, 0.0, 0.1, 1.0)
        assert bf16.bytes_sent == pytest.approx(Bf16Allreduce(workers, d).wire()[1], abs=8)
        for rank in (1, 2, 4):
            twin = PowerSGD(workers, shapes, ddp_wire.ddp_buckets(shapes), rank=rank)
            priced = plan.predict_baseline(f"powersgd-r{rank}", workers, model, 1e9, 50e-6,
                                           0.1, 1.0)
            messages, sent = twin.wire()
            assert priced.bytes_sent == sent
            assert priced.comm_s == pytest.approx(messages * 50e-6 + sent * 8 / 1e9)
    with pytest.raises(ValueError, match="PowerSGD needs the layers' shapes"):
        plan.predict_baseline("powersgd-r1", 8, plan.Model(d), 1e9, 0.0, 0.1, 1.0)


def test_a_flat_model_is_split_as_ddp_splits_one_of_its_size() -> None:
    d = 30_000_000
    flat, buckets = plan.Model(d).buckets()
    values = [sum(model_shapes.count([flat[i]]) for i in bucket) for bucket in buckets]
    assert sum(values) == d and values[0] == 2 ** 18 and values[1] == 25 * 2 ** 18


@pytest.mark.parametrize("name, published", [("resnet20", 269_722), ("resnet50", 25_557_032),
                                             ("vgg16", 138_357_544)])
def test_the_named_models_have_their_published_counts(name: str, published: int) -> None:
    assert model_shapes.count(model_shapes.MODELS[name]()) == published


def test_gpt2_medium_shapes_are_hugging_faces() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=24, n_embd=1024, n_head=16, vocab_size=50_257,
                                     n_positions=1_024)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
    assert [tuple(p.shape) for p in model.parameters()] == model_shapes.gpt2()


def test_the_lstm_shapes_are_the_examples() -> None:
    torch = pytest.importorskip("torch")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "pytorch_lm", Path(__file__).resolve().parents[2] / "examples" / "pytorch_lm.py")
    example = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(Path(spec.origin).parent))
    try:
        spec.loader.exec_module(example)
    finally:
        sys.path.pop(0)
    for name, size in (("lstm-lm", 256), ("lstm-lm-128", 128)):
        with torch.device("meta"):
            model = example.LSTMLanguageModel(10_002, size, 2, 0.2)
        assert [tuple(p.shape) for p in model.parameters()] == model_shapes.MODELS[name]()
    assert model_shapes.count(model_shapes.MODELS["lstm-lm-128"]()) == 1_554_450  # the study's


def test_the_decoder_shapes_are_the_examples() -> None:
    torch = pytest.importorskip("torch")
    import importlib.util

    root = Path(__file__).resolve().parents[2] / "examples"
    spec = importlib.util.spec_from_file_location("pytorch_transformer",
                                                  root / "pytorch_transformer.py")
    example = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(root))
    try:
        spec.loader.exec_module(example)
    finally:
        sys.path.pop(0)
    with torch.device("meta"):
        model = example.GPTDecoder(5_002, 128, 2, 4, 64, 0.0)
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == model_shapes.MODELS["gpt-decoder-study"]()
    assert model_shapes.count(shapes) == 1_045_248  # the AdamW study's


def test_the_gpu_selection_time_is_the_measured_one_not_this_cpus() -> None:
    h200 = devices.DEVICES["h200"]
    for d, seconds in h200.points:
        assert h200.select_s(d) == pytest.approx(seconds)
    assert devices.select_s("h200", 100_000_000, 0.01) < 2e-3
    with pytest.raises(ValueError, match="unknown device"):
        devices.select_s("tpu", 10, 0.1)


def run_plan(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gtopk_hvd.plan", *arguments],
                          capture_output=True, text=True, timeout=120)


def test_the_planner_prices_the_baselines_and_recommends_once_per_p(tmp_path) -> None:
    done = run_plan("--params", "resnet50", "--workers", "8", "32", "--compute-ms", "42")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for config in ("dense", "bf16", "powersgd-r1", "powersgd-r2", "powersgd-r4", "topk",
                   "oktopk"):
        assert f"  32 {config} " in out, out
    assert "NVIDIA H200" in out and "measured on this machine" not in out
    recommendations = [line for line in out.split("Recommendation:")[1].strip().splitlines()
                       if line.strip().startswith("P = ")]
    assert [line.split(":")[0].strip() for line in recommendations] == ["P = 8", "P = 32"], out
    assert all("use " in line and "runner-up" in line and "dense" in line
               for line in recommendations), out
    # the speed-up column is over dense at the same P
    dense_row = next(line for line in out.splitlines() if line.startswith("  32 dense "))
    assert dense_row.split()[-1] == "1.00x", dense_row

    counted = run_plan("--params", "25.6M", "--workers", "8", "--compute-ms", "42",
                       "--convergence", str(tmp_path / "none"))
    assert counted.returncode == 0, counted.stderr
    assert "powersgd" not in counted.stdout.split("Recommendation:")[0].split("\n", 1)[1]
    assert "PowerSGD not priced" in counted.stdout
    assert "step time only" in counted.stdout

    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps([[64, 32], [64]]))
    given = run_plan("--params", "x", "--shapes", str(shapes), "--workers", "4",
                     "--compute-ms", "1", "--select-ms", "0.1")
    assert given.returncode == 0 and "d = 2,112 parameters (2 tensors)" in given.stdout
    shapes.write_text(json.dumps({"not": "a list"}))
    bad = run_plan("--params", "x", "--shapes", str(shapes), "--compute-ms", "1")
    assert bad.returncode == 2 and "--shapes" in bad.stderr and "JSON list" in bad.stderr
    assert run_plan("--params", "resnet50", "--compute-ms", "1", "--overlap", "2").returncode == 2


def test_the_shipped_convergence_tables_are_the_studys_histories() -> None:
    """gtopk_hvd/data/convergence_lm_<name>.json (scripts/studies/convergence_table.py) holds what
    its folders under results/scale hold: rerun the script after a study."""
    if not convergence.DEFAULT_DIR.is_dir():
        pytest.skip("results/scale is not in this checkout")
    for name, table in convergence.SHIPPED.items():
        assert convergence.load(name) == convergence.load_shipped_sources(table), name
        batches = {(run.workers, run.global_batch) for run in convergence.load(name)}
        if name == "per-worker-8":  # the regime its name says
            assert all(batch == 8 * workers for workers, batch in batches), batches
        else:
            assert {batch for _, batch in batches} == {64}, batches
