"""The examples with P simulated workers in one process, at a fixed global batch.

    .venv/bin/python examples/simulated_cluster.py lm --workers 32 --global-batch 64 \\
        --compression gtopk --density 0.001 [any option of examples/pytorch_lm.py]
    .venv/bin/python examples/simulated_cluster.py transformer --workers 8 --global-batch 64 \\
        --compression gtopk --density 0.01 [any option of examples/pytorch_transformer.py]
    .venv/bin/python examples/simulated_cluster.py digits --workers 16 --global-batch 64 \\
        --compression gtopk --density 0.01 [any option of examples/pytorch_digits.py]

P workers, each with its own data shard, micro-batch (global / P), dropout stream, LSTM state,
residual and sparse-step state, run the real sparse step through gtopk_hvd's "local" transport
(`gtopk_hvd.simulate.SimulatedCluster`); the replicas, identical in synchronous SGD, are one
model. Worker r's forward and backward are exactly those of rank r of

    mpirun -np P .venv/bin/python examples/pytorch_lm.py --batch-size <global / P> [options]

(and likewise for the transformer of examples/pytorch_transformer.py, and the digits CNN of
examples/pytorch_digits.py: its DistributedSampler shard,
its learning rate x P), so the two end with bitwise identical weights for the sparse schemes
(their sums are gtopk_hvd's own) and equal to float rounding for dense (Horovod's all-reduce
sums in its own order): tests/tools/test_simulate.py. Prints the history as the example does, a
RESULT line and the parameters' CHECKSUM; --history writes the evaluations as JSON
(scripts/studies/scale_study.py reads them); lm --save and digits --checkpoint write the weights; lm
--record-k-sets the workers' largest entries at the last step (for `bench schemes --k-sets`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from types import ModuleType
from typing import Optional

import digits_common
import numpy as np
import pytorch_digits
import pytorch_lm
import pytorch_transformer
import torch
import torch_digits
from sparse_options import sparse_compression
from stdlib_corpus import load_corpus
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

from gtopk_hvd.simulate import SimulatedCluster
from gtopk_hvd.torch import ddp_baselines
from gtopk_hvd.torch.frozen_variance import FrozenVariance

EXAMPLES = {"lm": pytorch_lm, "transformer": pytorch_transformer, "digits": pytorch_digits}
LANGUAGE_MODELS = ("lm", "transformer")


def parse_args(argv: Optional[list[str]] = None) -> tuple[argparse.Namespace,
                                                          argparse.Namespace]:
    """(the simulation's options, the example's options with --batch-size = global / P)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Other options go to the example's parser.")
    parser.add_argument("model", choices=list(EXAMPLES),
                        help="lm: examples/pytorch_lm.py (LSTM, SGD); transformer: "
                             "examples/pytorch_transformer.py (GPT-style, AdamW); digits: "
                             "examples/pytorch_digits.py")
    parser.add_argument("--workers", type=int, required=True, help="P, the simulated workers")
    parser.add_argument("--global-batch", type=int, required=True,
                        help="sequences (lm, transformer) or images (digits) per step over all "
                             "workers (a "
                             "multiple of --workers)")
    parser.add_argument("--record-k-sets", metavar="NPZ", default=None,
                        help="lm: before the last step's reduction, write each worker's 2 k "
                             "largest entries of residual + gradient to NPZ (k = density d; "
                             "`python -m gtopk_hvd.bench schemes --k-sets` replays them)")
    parser.add_argument("--lose-residual-at", type=int, default=None, metavar="STEP",
                        help="lm: before this step's reduction, worker --lose-worker's "
                             "residual and velocity become zero, as for a worker that died and "
                             "was replaced by a new one (its unsent gradient is never applied)")
    parser.add_argument("--baseline", choices=("bf16", "powersgd"), default=None,
                        help="with --compression none: a DDP user's own compression in place "
                             "of the dense all-reduce, torch's bf16_compress_hook or "
                             "powerSGD_hook, as its arithmetic (gtopk_hvd.torch.ddp_baselines) "
                             "over DDP's default buckets")
    parser.add_argument("--powersgd-rank", type=int, default=1,
                        help="PowerSGD's matrix_approximation_rank")
    parser.add_argument("--powersgd-start-iter", type=int, default=10,
                        help="PowerSGD's start_powerSGD_iter (plain average before)")
    parser.add_argument("--lose-worker", type=int, default=None,
                        help="the worker whose residual is lost (default: the last)")
    if argv is not None and ("-h" in argv or "--help" in argv):
        print_help(parser)
    own, rest = parser.parse_known_args(argv)
    if own.workers < 1:
        parser.error("--workers must be >= 1")
    if own.global_batch < own.workers or own.global_batch % own.workers:
        parser.error(f"--global-batch ({own.global_batch}) must be a multiple of --workers "
                     f"({own.workers}): every worker takes global / P sequences")
    if own.record_k_sets and own.model not in LANGUAGE_MODELS:
        parser.error("--record-k-sets records a language model's sets")
    if own.lose_residual_at is not None and own.model not in LANGUAGE_MODELS:
        parser.error("--lose-residual-at is simulated for the language models")
    if own.lose_worker is None:
        own.lose_worker = own.workers - 1
    if not 0 <= own.lose_worker < own.workers:
        parser.error(f"--lose-worker must be a worker, 0 to {own.workers - 1}")
    if "--batch-size" in rest:
        parser.error("--batch-size is global / P here: give --global-batch")
    example = EXAMPLES[own.model].parse_args(
        rest + ["--batch-size", str(own.global_batch // own.workers)])
    if getattr(example, "backward_passes_per_step", 1) != 1 or getattr(example, "resume", None):
        parser.error("--backward-passes-per-step and --resume are not simulated")
    if own.baseline and (example.compression != "none" or own.model not in LANGUAGE_MODELS):
        parser.error("--baseline replaces the dense all-reduce of a language model: give it "
                     "with --compression none")
    if example.compression == "fp16":
        parser.error("fp16 is Horovod's dense all-reduce of float16 values: simulate "
                     "--compression none")
    return own, example


def print_help(parser: argparse.ArgumentParser) -> None:
    """This parser's help, then each example's (whose options pass through); exits 0."""
    parser.print_help()
    for name, example in EXAMPLES.items():
        print(f"\noptions of {name}, passed to examples/{example.__name__}.py:\n")
        try:
            example.parse_args(["--help"])
        except SystemExit:
            pass
    raise SystemExit(0)


def point_gradients(parameters: list[torch.Tensor], flat: np.ndarray) -> None:
    """p.grad := the view of p's slice of `flat` (backward accumulates there in place, as into
    gtopk_hvd's fused buffer)."""
    buffer, offset = torch.from_numpy(flat), 0
    for p in parameters:
        p.grad = buffer[offset:offset + p.numel()].view(p.shape)
        offset += p.numel()


def simulate_lm(own: argparse.Namespace, args: argparse.Namespace, recipe: ModuleType) -> dict:
    """pytorch_lm.train with `recipe` (pytorch_lm or pytorch_transformer): worker r on its
    shard, its dropout stream and its carried state."""
    torch.set_num_threads(1)
    workers = own.workers
    corpus = load_corpus(args.vocab_size)
    shards = [pytorch_lm.batchify(pytorch_lm.worker_shard(corpus.train, rank, workers),
                                  args.batch_size) for rank in range(workers)]
    steps_per_epoch = min((shard.size(0) - 1) // args.bptt for shard in shards)
    total_steps, eval_every = pytorch_lm.run_length(args, steps_per_epoch)

    torch.manual_seed(args.seed)
    model = recipe.build_model(args, len(corpus.vocab))
    dropout_streams = []  # worker r seeds seed + 1 + r, as rank r of the mpirun job
    for rank in range(workers):
        torch.manual_seed(args.seed + 1 + rank)
        dropout_streams.append(torch.get_rng_state())
    optimizer = recipe.build_optimizer(args, model)
    parameters = [p for p in model.parameters() if p.requires_grad]
    params = sum(p.numel() for p in parameters)
    dense = args.compression in digits_common.DENSE
    local_steps = None  # --sparsify update: each worker's own optimizer (its own moments)
    if getattr(args, "sparsify", "gradient") == "update" and not dense:
        local_steps = LocalOptimizerSteps(parameters, [recipe.build_optimizer(args, model)
                                                       for _ in range(workers)], args.clip)
    frozen = None  # --sparsify preconditioned: the optimizer's freeze_variance_after
    if getattr(args, "sparsify", "gradient") == "preconditioned" and not dense:
        frozen = FrozenVariance(optimizer, parameters, args.dense_steps,
                                args.momentum if args.momentum_correction else None)
    baseline = None
    if own.baseline:
        shapes = [tuple(p.shape) for p in parameters]
        baseline = (ddp_baselines.Bf16Allreduce(workers, params) if own.baseline == "bf16" else
                    ddp_baselines.PowerSGD(workers, shapes, ddp_baselines.ddp_buckets(shapes),
                                           rank=own.powersgd_rank,
                                           start_iter=own.powersgd_start_iter))
    cluster = SimulatedCluster(None if dense else sparse_compression(args, steps_per_epoch),
                               [p.numel() for p in parameters], workers, baseline=baseline)

    hidden = [model.initial_hidden(args.batch_size) for _ in range(workers)]
    lost: dict = {}
    history, sparse_steps, seconds = [], [], {"compute": 0.0, "reduce": 0.0, "apply": 0.0}
    progress = tqdm(total=total_steps, disable=args.quiet, desc=f"train P={workers}")
    for step in range(total_steps):
        start = (step % steps_per_epoch) * args.bptt
        for one in [optimizer] + (local_steps.optimizers if local_steps else []):
            for group in one.param_groups:
                group["lr"] = recipe.learning_rate(args, step, total_steps)
        began = time.perf_counter()
        loss = 0.0
        for rank, shard in enumerate(shards):
            if start == 0:
                hidden[rank] = model.initial_hidden(args.batch_size)
            state = [h.detach() for h in hidden[rank]]
            torch.set_rng_state(dropout_streams[rank])
            point_gradients(parameters, cluster.gradients[rank])
            loss += pytorch_lm.forward_backward(model, shard[start:start + args.bptt],
                                                shard[start + 1:start + 1 + args.bptt], state)
            if frozen is not None and not frozen.dense:  # as the example: its own gradient
                torch.nn.utils.clip_grad_norm_(parameters, args.clip)
            hidden[rank] = state
            dropout_streams[rank] = torch.get_rng_state()
        computed = time.perf_counter()
        if own.record_k_sets and step + 1 == total_steps:
            record_k_sets(own.record_k_sets, cluster, args.density)
        if step == own.lose_residual_at and not dense:
            lost = lose_residual(cluster, own.lose_worker)
        if local_steps is not None:
            local_steps.replace_gradients_by_steps(cluster.gradients)
        warming = frozen is not None and frozen.dense
        if frozen is not None and not warming:
            for gradient in cluster.gradients:
                frozen.precondition_(torch.from_numpy(gradient))
        update = cluster.reduce(dense=warming)
        reduced = time.perf_counter()
        if step == own.lose_residual_at and not dense:
            lost["update_l2"] = float(np.linalg.norm(update))
        if local_steps is not None:
            local_steps.apply(update)
        elif frozen is not None and not warming:
            point_gradients(parameters, update)
            frozen.step()
        else:
            point_gradients(parameters, update)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
        applied = time.perf_counter()
        for phase, seconds_spent in (("compute", computed - began), ("reduce", reduced - computed),
                                     ("apply", applied - reduced)):
            seconds[phase] += seconds_spent
        if not dense:
            sparse_steps.append({"k": cluster.last_stats[0].k,
                                 "selected": cluster.last_stats[0].global_entries})
        progress.update(1)
        progress.set_postfix(loss=f"{loss / workers:.3f}", refresh=False)
        if (step + 1) % eval_every == 0 or step + 1 == total_steps:
            history.append({
                "step": step + 1, "seconds": sum(seconds.values()),
                "phases": {phase: total / (step + 1) for phase, total in seconds.items()},
                "valid_perplexity": perplexity(model, corpus.valid, args.bptt, workers),
                "lr": optimizer.param_groups[0]["lr"],
                "density": 1.0 if dense else float(cluster.last_stats[0].density),
                "bytes_per_step": max(cluster.bytes_sent)})
            if not args.quiet:
                progress.write(json.dumps(history[-1]))
    progress.close()
    cluster.close()
    return {"model": model, "params": params, "workers": workers, "steps": total_steps,
            "steps_per_epoch": steps_per_epoch, "global_batch": own.global_batch,
            "lost_residual": lost, "evaluations": history, "sparse_steps": sparse_steps,
            "test_perplexity": perplexity(model, corpus.test, args.bptt, workers)}


class LocalOptimizerSteps:
    """--sparsify update: each worker's optimizer steps on its own (clipped) gradient, and the
    step it would take, not the gradient, is what the sparse scheme reduces (with error
    feedback): worker r's contribution is delta_r = (its optimizer's step from the current
    weights) - (the current weights); the weights then move by the average of the sparsified
    deltas. The workers' optimizer states (Adam's moments) stay their own."""

    def __init__(self, parameters: list[torch.Tensor], optimizers: list, clip: float) -> None:
        self.parameters, self.optimizers, self.clip = parameters, optimizers, clip
        self.weights = torch.cat([p.detach().reshape(-1) for p in parameters])

    def replace_gradients_by_steps(self, gradients: list[np.ndarray]) -> None:
        """gradients[r] := worker r's optimizer step from the current weights (the weights are
        back where they were on return)."""
        torch.cat([p.detach().reshape(-1) for p in self.parameters], out=self.weights)
        for gradient, optimizer in zip(gradients, self.optimizers, strict=True):
            point_gradients(self.parameters, gradient)
            torch.nn.utils.clip_grad_norm_(self.parameters, self.clip)
            optimizer.step()
            flat = torch.from_numpy(gradient)
            torch.cat([p.detach().reshape(-1) for p in self.parameters], out=flat)
            flat -= self.weights
            self._set_weights(self.weights)

    def apply(self, update: np.ndarray) -> None:
        """weights += update (the average of the sparsified steps)."""
        self._set_weights(self.weights + torch.from_numpy(update))

    def _set_weights(self, flat: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.parameters:
                p.copy_(flat[offset:offset + p.numel()].view(p.shape))
                offset += p.numel()


def lose_residual(cluster: SimulatedCluster, worker: int) -> dict:
    """Worker `worker`'s residual and velocity become zero; returns what was lost: its step,
    the residual's L1 and L2 norms and the number of its non-zero entries."""
    states = cluster.state_dict()
    residual = states[worker]["residual"]
    lost = {"worker": worker, "step": states[worker]["step"],
            "l1": float(np.abs(residual).sum()), "l2": float(np.linalg.norm(residual)),
            "nonzero": int(np.count_nonzero(residual))}
    states[worker] = {**states[worker], "residual": np.zeros_like(residual)}
    if "velocity" in states[worker]:
        states[worker]["velocity"] = np.zeros_like(states[worker]["velocity"])
    cluster.load_state_dict(states)
    return lost


def record_k_sets(path: str, cluster: SimulatedCluster, density: float) -> None:
    """The workers' largest entries now (`SimulatedCluster.largest_entries`), 2 k of them."""
    count = min(cluster.d, 2 * max(1, math.ceil(density * cluster.d)))
    indices, values = cluster.largest_entries(count)
    np.savez_compressed(path, d=cluster.d, workers=cluster.workers, density=density,
                        indices=indices.astype(np.int32), values=values)


def perplexity(model: torch.nn.Module, tokens: np.ndarray, bptt: int,
               workers: int) -> float:
    """pytorch_lm.perplexity over P workers' shards: the sum of their totals."""
    total = sum(pytorch_lm.loss_totals(model, tokens, bptt, rank, workers)
                for rank in range(workers))
    return math.exp(total[0].item() / total[1].item())


def simulate_digits(own: argparse.Namespace, args: argparse.Namespace) -> None:
    """pytorch_digits.py's training, worker r on its DistributedSampler shard."""
    torch.set_num_threads(1)
    workers = own.workers
    train_set, test_set = torch_digits.load_data()
    samplers = [DistributedSampler(train_set, num_replicas=workers, rank=rank, shuffle=True,
                                   seed=args.seed) for rank in range(workers)]
    loaders = [DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
               for sampler in samplers]
    model = torch_digits.build_model(args.seed)
    dense = args.compression in digits_common.DENSE
    corrected = args.momentum_correction and not dense
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * workers,
                                momentum=0.0 if corrected else args.momentum)
    parameters = [p for p in model.parameters() if p.requires_grad]
    cluster = SimulatedCluster(None if dense else sparse_compression(args, len(loaders[0])),
                               [p.numel() for p in parameters], workers)
    history, began = [], time.perf_counter()
    for epoch in range(args.epochs):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        model.train()
        for batches in tqdm(zip(*loaders), total=len(loaders[0]), disable=args.quiet,
                            desc=f"epoch {epoch + 1}"):
            for rank, (images, labels) in enumerate(batches):
                point_gradients(parameters, cluster.gradients[rank])
                torch.nn.functional.cross_entropy(model(images), labels).backward()
            point_gradients(parameters, cluster.reduce())
            optimizer.step()
        accuracy, test_loss = torch_digits.evaluate(model, test_set)
        history.append({"epoch": epoch + 1, "step": (epoch + 1) * len(loaders[0]),
                        "seconds": time.perf_counter() - began, "test_loss": test_loss,
                        "test_accuracy": accuracy, "bytes_per_step": max(cluster.bytes_sent)})
    cluster.close()
    if args.history:
        with open(args.history, "w") as file:
            json.dump({"workers": workers, "global_batch": own.global_batch,
                       "compression": args.compression, "density_asked": args.density,
                       "evaluations": history}, file, indent=1)
    if args.checkpoint:
        torch.save({"model": model.state_dict()}, args.checkpoint)
    digits_common.emit("RESULT simulated " + digits_common.result_line(
        compression=args.compression, density=1.0 if dense else args.density, workers=workers,
        epochs=args.epochs, test_accuracy=accuracy, test_loss=test_loss,
        bytes_per_step=history[-1]["bytes_per_step"],
        params=torch_digits.parameter_count(model))[len("RESULT "):])
    digits_common.emit(f"CHECKSUM simulated {torch_digits.checksum(model)}")


def main(argv: Optional[list[str]] = None) -> None:
    own, args = parse_args(argv)
    if own.model == "digits":
        simulate_digits(own, args)
        return
    run = simulate_lm(own, args, EXAMPLES[own.model])
    model = run.pop("model")
    last = run["evaluations"][-1]
    compression = {None: args.compression, "bf16": "bf16",
                   "powersgd": f"powersgd-r{own.powersgd_rank}"}[own.baseline]
    if args.history:
        with open(args.history, "w") as file:
            json.dump({**run, "compression": compression, "density_asked": args.density,
                       "lr": args.lr}, file, indent=1)
    if args.save:
        pytorch_lm.save_parameters(args.save, model)
    digits_common.emit(
        f"RESULT simulated compression={compression} density={last['density']:g} "
        f"workers={own.workers} global_batch={own.global_batch} steps={run['steps']} "
        f"valid_perplexity={last['valid_perplexity']:.2f} "
        f"test_perplexity={run['test_perplexity']:.2f} bytes_per_step={last['bytes_per_step']} "
        f"params={run['params']} seconds={last['seconds']:.2f}")
    digits_common.emit(f"CHECKSUM simulated {pytorch_lm.parameters_checksum(model)}")


if __name__ == "__main__":
    main(sys.argv[1:])
