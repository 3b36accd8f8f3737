"""Horovod PyTorch training of a 2-layer LSTM language model on the standard library's text, with
Horovod's dense allreduce, Top-k or gTop-k picked by one line (`distributed_optimizer`).

The corpus is the running Python's standard library (examples/stdlib_corpus.py: ~1.1 M tokens,
a 10k-token vocabulary), so nothing is downloaded. The model is the classic word-level LSTM
(Zaremba et al.; PyTorch's word_language_model example): embedding, 2 LSTM layers, decoder tied
to the embedding, dropout, truncated back-propagation through time (BPTT) over windows of
--bptt tokens with the hidden state carried between windows, plain SGD, and gradient clipping
done the Horovod way: `optimizer.synchronize()`, clip the reduced gradient, then
`with optimizer.skip_synchronize(): optimizer.step()`.

Each worker trains on its own contiguous 1/P of the training tokens; validation perplexity is
exp of the mean cross-entropy over all validation tokens (each worker evaluates 1/P of them,
then one allreduce). Every --eval-every steps rank 0 prints it with the mean time of each phase
of a step (examples/step_timing.py) and the bytes each worker sent per step.

    mpirun --allow-run-as-root --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \\
        .venv/bin/python examples/pytorch_lm.py --compression gtopk --density 0.001

Rank 0 ends with a RESULT line, every rank with a CHECKSUM line of its parameters (replicas
must be bitwise identical); --history writes every evaluation as JSON for
scripts/studies/time_to_accuracy.py. "seconds" there is training time: evaluation is not counted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from functools import partial
from types import ModuleType
from typing import Any, Optional

import digits_common
import numpy as np
import torch
import torch.nn.functional as F
from sparse_options import add_sparse_arguments, sparse_compression
from stdlib_corpus import load_corpus
from step_timing import StepTimer, timed_step
from torch import nn
from tqdm import tqdm

# horovod.torch and gtopk_hvd.torch, imported by `train` (examples/ddp_transformer.py uses this
# module's corpus, windows and evaluation without Horovod).
hvd: Any = None
gtopk: Any = None


def import_horovod() -> None:
    """Imports Horovod and gtopk_hvd.torch (before hvd.init(): under mpirun it loads MPI)."""
    global hvd, gtopk
    import horovod.torch as horovod_torch

    import gtopk_hvd.torch as gtopk_torch
    hvd, gtopk = horovod_torch, gtopk_torch

EVAL_BATCH = 10


class LSTMLanguageModel(nn.Module):
    """Embedding (vocab x size), `layers` LSTM layers of `size` units, a decoder that shares
    the embedding's weight (tied, so its size equals the embedding's) plus its own bias."""

    def __init__(self, vocab: int, size: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, size)
        self.lstm = nn.LSTM(size, size, layers, dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self.decoder = nn.Linear(size, vocab)
        self.decoder.weight = self.embedding.weight
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, tokens: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """tokens: (time, batch) ids -> logits (time, batch, vocab) and the last hidden state."""
        output, hidden = self.lstm(self.dropout(self.embedding(tokens)), hidden)
        return self.decoder(self.dropout(output)), hidden

    def initial_hidden(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.lstm.num_layers, batch, self.lstm.hidden_size)
        return torch.zeros(shape), torch.zeros(shape)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_scheme_arguments(parser, density=0.001)
    parser.add_argument("--size", type=int, default=256, help="embedding and LSTM width")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--batch-size", type=int, default=20, help="sequences per worker")
    parser.add_argument("--bptt", type=int, default=35, help="tokens per truncated window")
    parser.add_argument("--lr", type=float, default=20.0,
                        help="SGD learning rate of the averaged gradient (not scaled by P)")
    parser.add_argument("--momentum", type=float, default=0.0,
                        help="SGD momentum (0: plain SGD, as the classic LSTM recipe)")
    parser.add_argument("--clip", type=float, default=0.25, help="max norm of the gradient")
    parser.add_argument("--decay-at", type=float, nargs="*", default=[0.5, 0.75],
                        help="fractions of the run after which the learning rate is x --decay")
    parser.add_argument("--decay", type=float, default=0.25)
    parser.add_argument("--lr-warmup-steps", type=int, default=0,
                        help="the learning rate rises linearly from --lr / N to --lr over the "
                             "first N steps (Goyal et al.'s gradual warm-up for a large batch)")
    add_run_arguments(parser)
    args = check_run_arguments(parser, parser.parse_args(argv))
    if args.lr_warmup_steps < 0:
        parser.error("--lr-warmup-steps must be >= 0")
    return args


def add_scheme_arguments(parser: argparse.ArgumentParser, density: float) -> None:
    """--compression, --density (default `density`) and --vocab-size: what this example and
    examples/pytorch_transformer.py share first."""
    parser.add_argument("--compression", choices=digits_common.COMPRESSIONS, default="gtopk",
                        help="none/fp16: Horovod's dense allreduce; the others gtopk_hvd's "
                             "sparse schemes")
    parser.add_argument("--density", type=float, default=density,
                        help="k/d for the sparse schemes")
    parser.add_argument("--vocab-size", type=int, default=10_000)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The run's length, evaluation, seed, sparse options and outputs (`train` reads them)."""
    parser.add_argument("--epochs", type=int, default=1, help="passes over each worker's shard")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: none)")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="steps between validations (0: once per epoch)")
    parser.add_argument("--seed", type=int, default=42)
    add_sparse_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--history", metavar="PATH", default=None,
                        help="rank 0 writes every validation (step, seconds, perplexity, "
                             "phase times, bytes per step) to PATH as JSON")
    parser.add_argument("--save", metavar="PATH", default=None,
                        help="rank 0 writes the final parameters to PATH (.npz, by name)")


def check_run_arguments(parser: argparse.ArgumentParser,
                        args: argparse.Namespace) -> argparse.Namespace:
    """Refuses a density outside (0, 1] and negative step counts; returns args."""
    if not 0.0 < args.density <= 1.0:
        parser.error("--density must be in (0, 1]")
    if args.max_steps < 0 or args.eval_every < 0:
        parser.error("--max-steps and --eval-every must be >= 0")
    return args


def batchify(tokens: np.ndarray, batch: int) -> torch.Tensor:
    """(rows, batch) columns of consecutive tokens; the tail that does not fill a row is cut."""
    rows = len(tokens) // batch
    return torch.from_numpy(tokens[:rows * batch].astype(np.int64)).view(batch, rows).t()


def run_length(args: argparse.Namespace, steps_per_epoch: int) -> tuple[int, int]:
    """(steps of the run, steps between validations): --epochs epochs, at most --max-steps,
    a validation every --eval-every steps (0: once per epoch)."""
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    return total_steps, args.eval_every or steps_per_epoch


def worker_shard(tokens: np.ndarray, rank: int, workers: int) -> np.ndarray:
    """This worker's contiguous 1/P of the tokens."""
    bounds = np.linspace(0, len(tokens), workers + 1).astype(int)
    return tokens[bounds[rank]:bounds[rank + 1]]


def distributed_optimizer(args: argparse.Namespace, optimizer: torch.optim.Optimizer,
                          model: nn.Module, steps_per_epoch: int) -> torch.optim.Optimizer:
    """The one place that differs from a plain Horovod script."""
    if args.compression in digits_common.DENSE:
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        compression=getattr(hvd.Compression, args.compression))
    frozen = args.dense_steps if getattr(args, "sparsify", None) == "preconditioned" else None
    return gtopk.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                      compression=sparse_compression(args, steps_per_epoch),
                                      freeze_variance_after=frozen)


def perplexity(model: nn.Module, tokens: np.ndarray, bptt: int) -> float:
    """exp(mean cross-entropy) over `tokens`, each worker evaluating its 1/P."""
    total = hvd.allreduce(loss_totals(model, tokens, bptt, hvd.rank(), hvd.size()), op=hvd.Sum,
                          name="lm_eval")
    return math.exp(total[0].item() / total[1].item())


@torch.no_grad()
def loss_totals(model: nn.Module, tokens: np.ndarray, bptt: int, rank: int,
                workers: int) -> torch.Tensor:
    """[summed cross-entropy, token count] (float64) over worker `rank`'s 1/P of `tokens`."""
    model.eval()
    data = batchify(worker_shard(tokens, rank, workers), EVAL_BATCH)
    hidden = model.initial_hidden(EVAL_BATCH)
    total = torch.zeros(2, dtype=torch.float64)
    for start in range(0, data.size(0) - 1, bptt):
        inputs = data[start:start + bptt]
        targets = data[start + 1:start + 1 + len(inputs)]
        logits, hidden = model(inputs[:len(targets)], hidden)
        total[0] += F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1),
                                    reduction="sum").item()
        total[1] += targets.numel()
    model.train()
    return total


def forward_backward(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                     hidden: list[torch.Tensor]) -> float:
    """Loss of one BPTT window and its backward pass; `hidden` becomes the window's last state."""
    logits, hidden[:] = model(inputs, tuple(hidden))
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
    loss.backward()
    return loss.item()


def learning_rate(args: argparse.Namespace, step: int, total_steps: int) -> float:
    """--lr, times --decay after each fraction in --decay-at of the run, times (step + 1) / N
    over the first N = --lr-warmup-steps steps."""
    passed = sum(step >= fraction * total_steps for fraction in args.decay_at)
    rate = args.lr * args.decay ** passed
    if step < args.lr_warmup_steps:
        rate *= (step + 1) / args.lr_warmup_steps
    return rate


def build_model(args: argparse.Namespace, vocab: int) -> LSTMLanguageModel:
    """The LSTM of --size units in --layers layers (the same weights on every worker: the
    caller seeds torch first)."""
    return LSTMLanguageModel(vocab, args.size, args.layers, args.dropout)


def build_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    """Plain SGD (with --momentum), the classic LSTM recipe."""
    return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)


def main() -> None:
    train(parse_args(), sys.modules[__name__])


def train(args: argparse.Namespace, recipe: ModuleType) -> None:
    """The training loop of this example and of examples/pytorch_transformer.py: the model, the
    optimizer and the learning rate come from `recipe` (a module with build_model,
    build_optimizer and learning_rate); a model takes (tokens, state) and returns (logits,
    state), its `initial_hidden(batch)` the state carried between windows."""
    import_horovod()
    hvd.init()
    torch.set_num_threads(1)
    rank, workers = hvd.rank(), hvd.size()

    corpus = load_corpus(args.vocab_size)
    data = batchify(worker_shard(corpus.train, rank, workers), args.batch_size)
    steps_per_epoch = (data.size(0) - 1) // args.bptt
    total_steps, eval_every = run_length(args, steps_per_epoch)

    torch.manual_seed(args.seed)
    model = recipe.build_model(args, len(corpus.vocab))
    torch.manual_seed(args.seed + 1 + rank)  # dropout masks differ between workers
    optimizer = recipe.build_optimizer(args, model)
    optimizer = distributed_optimizer(args, optimizer, model, steps_per_epoch)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    params = sum(p.numel() for p in model.parameters())

    timer, history, seconds, sparse_steps = StepTimer(), [], 0.0, []
    hidden = model.initial_hidden(args.batch_size)
    show = rank == 0 and not args.quiet
    progress = tqdm(total=total_steps, disable=not show, desc="train")
    for step in range(total_steps):
        start = (step % steps_per_epoch) * args.bptt
        if start == 0:
            hidden = model.initial_hidden(args.batch_size)
        inputs, targets = data[start:start + args.bptt], data[start + 1:start + 1 + args.bptt]
        hidden = [h.detach() for h in hidden]  # forward_backward replaces it in place
        for group in optimizer.param_groups:
            group["lr"] = recipe.learning_rate(args, step, total_steps)

        began = time.perf_counter()
        loss = timed_step(optimizer, partial(forward_backward, model, inputs, targets, hidden),
                          timer, clip=partial(nn.utils.clip_grad_norm_, model.parameters(),
                                              args.clip),
                          # The preconditioned update is no gradient: each worker clips its own.
                          clip_first=getattr(optimizer, "preconditioned", False))
        seconds += time.perf_counter() - began
        stats = getattr(optimizer, "last_stats", None)  # gtopk_hvd's sparse optimizers
        if stats is not None:
            sparse_steps.append({"k": stats.k, "selected": stats.global_entries})
        progress.update(1)
        progress.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if (step + 1) % eval_every == 0 or step + 1 == total_steps:
            history.append(evaluation(args, model, corpus.valid, optimizer, timer, step + 1,
                                      seconds, params, workers))
            timer.reset()
            if show:
                progress.write(json.dumps(history[-1]))
    progress.close()

    test_ppl = perplexity(model, corpus.test, args.bptt)
    if rank == 0:
        write_history(args.history, params=params, workers=workers, steps=total_steps,
                      steps_per_epoch=steps_per_epoch, test_perplexity=test_ppl,
                      evaluations=history, sparse_steps=sparse_steps)
        digits_common.emit(
            f"RESULT compression={args.compression} density={history[-1]['density']:g} "
            f"workers={workers} steps={total_steps} valid_perplexity="
            f"{history[-1]['valid_perplexity']:.2f} test_perplexity={test_ppl:.2f} "
            f"bytes_per_step={history[-1]['bytes_per_step']} params={params}")
        if args.save:
            save_parameters(args.save, model)
    digits_common.emit(digits_common.checksum_line(rank, parameters_checksum(model)))


def write_history(path: Optional[str], **run: Any) -> None:
    """--history: the run's figures and evaluations as JSON at `path` (nothing if None)."""
    if path:
        with open(path, "w") as file:
            json.dump(run, file, indent=1)


def parameters_checksum(model: nn.Module) -> str:
    """sha256 of the parameters' bytes, in model.parameters() order."""
    return digits_common.sha256_hex(p.detach().numpy() for p in model.parameters())


def save_parameters(path: str, model: nn.Module) -> None:
    """The parameters as float32 arrays in an .npz, keyed by name."""
    np.savez(path, **{name: p.detach().numpy() for name, p in model.named_parameters()})


def evaluation(args: argparse.Namespace, model: nn.Module, valid: np.ndarray,
               optimizer: torch.optim.Optimizer, timer: StepTimer, step: int, seconds: float,
               params: int, workers: int) -> dict:
    """One history entry: validation perplexity, the phases' mean seconds per step since the
    last entry (averaged over workers) and the bytes this worker sent in the last step."""
    phases = hvd.allreduce(torch.tensor(list(timer.means().values()), dtype=torch.float64),
                           op=hvd.Average, name="lm_phases")
    sent, density = digits_common.communication(
        args.compression, args.density, getattr(optimizer, "last_stats", None), params, workers)
    return {"step": step, "seconds": seconds,
            "valid_perplexity": perplexity(model, valid, args.bptt),
            "lr": optimizer.param_groups[0]["lr"], "density": density, "bytes_per_step": sent,
            "phases": dict(zip(timer.means(), phases.tolist()))}


if __name__ == "__main__":
    main()
