"""Horovod PyTorch training of a small GPT-style decoder with AdamW on the standard library's
text, with Horovod's dense allreduce or one of gtopk_hvd's sparse schemes picked by one line
(`pytorch_lm.distributed_optimizer`).

The corpus, the shards, the evaluation and the training loop are examples/pytorch_lm.py's (its
`train`, with this module as the recipe); what differs is the model and the optimizer:

- a decoder-only transformer (GPT-2's layout): token and learned position embeddings, --layers
  pre-LayerNorm blocks of causal multi-head self-attention (--heads) and a 4x GELU MLP, a final
  LayerNorm and a decoder tied to the token embedding; context = --bptt tokens, each window
  read on its own (no state carried between windows);
- AdamW (betas 0.9 / 0.95), decoupled weight decay on the matrices only (not on biases, the
  LayerNorms or the position embedding), the learning rate warmed up linearly over
  --warmup-steps and then cosine-decayed to --min-lr-ratio of --lr at the last step;
- gradient clipping at --clip, the Horovod way (synchronize, clip, skip_synchronize).

With a sparse scheme the gradient is sparsified before AdamW sees it (the wrapped optimizer
gets the averaged sparse update): docs/adamw.md says what that does to Adam's moments, and why
`--sparsify preconditioned` (the optimizer's `freeze_variance_after`) does better; with
`--momentum-correction` too, AdamW's first moment moves into the exchange (1-bit Adam's
structure: each worker's velocity of the preconditioned gradient is what is sparsified).

    mpirun --allow-run-as-root --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \\
        .venv/bin/python examples/pytorch_transformer.py --compression gtopk --density 0.01

examples/simulated_cluster.py transformer runs the same job with P simulated workers in one
process, ending with bitwise the same weights for the sparse schemes (tests/tools/test_simulate.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, Optional

import pytorch_lm
import torch
import torch.nn.functional as F
from torch import nn

BETAS = (0.9, 0.95)
"""AdamW's (beta1, beta2)."""


class Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)); attention causal over the window."""

    def __init__(self, size: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(size)
        self.qkv = nn.Linear(size, 3 * size)
        self.projection = nn.Linear(size, size)
        self.mlp_norm = nn.LayerNorm(size)
        self.mlp = nn.Sequential(nn.Linear(size, 4 * size), nn.GELU(), nn.Linear(4 * size, size))
        self.dropout = nn.Dropout(dropout)
        self.attention_dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, time, size)."""
        batch, time, size = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).split(size, dim=2)
        q, k, v = (t.view(batch, time, self.heads, size // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        attended = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.attention_dropout if self.training else 0.0)
        attended = attended.transpose(1, 2).reshape(batch, time, size)
        x = x + self.dropout(self.projection(attended))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class GPTDecoder(nn.Module):
    """Token + position embeddings, `layers` Blocks, a final LayerNorm, a decoder tied to the
    token embedding. Takes and returns pytorch_lm's (time, batch) layout and a state (always
    empty: every window is read on its own)."""

    def __init__(self, vocab: int, size: int, layers: int, heads: int, context: int,
                 dropout: float) -> None:
        super().__init__()
        if size % heads:
            raise ValueError(f"--size ({size}) must be a multiple of --heads ({heads})")
        self.context = context
        self.token_embedding = nn.Embedding(vocab, size)
        self.position_embedding = nn.Embedding(context, size)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(size, heads, dropout) for _ in range(layers))
        self.final_norm = nn.LayerNorm(size)
        self.decoder = nn.Linear(size, vocab, bias=False)
        self.decoder.weight = self.token_embedding.weight
        self.apply(self._initialise)
        for block in self.blocks:  # GPT-2: residual projections scaled by 1/sqrt(2 layers)
            for linear in (block.projection, block.mlp[2]):
                nn.init.normal_(linear.weight, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _initialise(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, state: tuple = ()) -> tuple[torch.Tensor, tuple]:
        """tokens: (time, batch) ids, time <= context -> logits (time, batch, vocab), ()."""
        tokens = tokens.t()
        positions = torch.arange(tokens.size(1))
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        return self.decoder(self.final_norm(x).transpose(0, 1).contiguous()), ()

    def initial_hidden(self, batch: int) -> tuple:
        return ()


def parse_args(argv: Optional[list[str]] = None,
               more: Optional[Callable[[argparse.ArgumentParser], None]] = None,
               description: str = __doc__.splitlines()[0]) -> argparse.Namespace:
    """This example's arguments, and those `more` adds (examples/ddp_transformer.py's)."""
    parser = argparse.ArgumentParser(description=description)
    if more is not None:
        more(parser)
    pytorch_lm.add_scheme_arguments(parser, density=0.01)
    parser.add_argument("--size", type=int, default=192, help="embedding and model width")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=16, help="windows per worker")
    parser.add_argument("--bptt", type=int, default=64, help="tokens per window (the context)")
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW's peak learning rate")
    parser.add_argument("--weight-decay", type=float, default=0.1,
                        help="AdamW's decoupled weight decay (matrices only)")
    parser.add_argument("--warmup-steps", type=int, default=100,
                        help="steps of linear learning-rate warm-up from 0")
    parser.add_argument("--min-lr-ratio", type=float, default=0.1,
                        help="the cosine decay ends at this fraction of --lr")
    parser.add_argument("--clip", type=float, default=1.0, help="max norm of the gradient")
    parser.add_argument("--sparsify", choices=["gradient", "update", "preconditioned"],
                        default="gradient",
                        help="what the sparse scheme reduces: the gradient (AdamW then steps on "
                             "the sparse average), each worker's own AdamW step (its "
                             "moments its own; simulated cluster only), or the gradient "
                             "divided by AdamW's second moment, frozen after --dense-steps "
                             "dense steps (the optimizer's freeze_variance_after; each worker "
                             "then clips its own gradient before the reduction)")
    parser.add_argument("--dense-steps", type=int, default=None,
                        help="--sparsify preconditioned: dense AdamW steps before the second "
                             "moment is frozen (default: --warmup-steps, at least 1)")
    pytorch_lm.add_run_arguments(parser)
    args = pytorch_lm.check_run_arguments(parser, parser.parse_args(argv))
    if args.warmup_steps < 0:
        parser.error("--warmup-steps must be >= 0")
    if args.dense_steps is None:
        args.dense_steps = max(1, args.warmup_steps)
    if args.dense_steps < 1:
        parser.error("--dense-steps must be >= 1")
    if args.size % args.heads:
        parser.error(f"--size ({args.size}) must be a multiple of --heads ({args.heads})")
    if args.momentum_correction and args.sparsify != "preconditioned":
        parser.error("--momentum-correction moves AdamW's first moment into the exchange, which "
                     "needs its second moment frozen: add --sparsify preconditioned")
    args.momentum = BETAS[0]  # the momentum correction's momentum is AdamW's beta1
    return args


def build_model(args: argparse.Namespace, vocab: int) -> GPTDecoder:
    return GPTDecoder(vocab, args.size, args.layers, args.heads, args.bptt, args.dropout)


def build_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW; weight decay on the parameters of two or more dimensions but the position
    embedding (the matrices of the attention, the MLP and the tied token embedding)."""
    decayed = [p for name, p in model.named_parameters()
               if p.dim() >= 2 and not name.startswith("position_embedding")]
    kept = [p for name, p in model.named_parameters()
            if p.dim() < 2 or name.startswith("position_embedding")]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": args.weight_decay},
                              {"params": kept, "weight_decay": 0.0}],
                             lr=args.lr, betas=BETAS)


def learning_rate(args: argparse.Namespace, step: int, total_steps: int) -> float:
    """Linear warm-up to --lr over --warmup-steps, then cosine decay to --min-lr-ratio x --lr
    at the last step."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    span = max(1, total_steps - 1 - args.warmup_steps)
    progress = min(1.0, (step - args.warmup_steps) / span)
    floor = args.min_lr_ratio * args.lr
    return floor + (args.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def main() -> None:
    pytorch_lm.train(parse_args(), sys.modules[__name__])


if __name__ == "__main__":
    main()
