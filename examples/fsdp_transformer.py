"""torchrun + FSDP2 (`fully_shard`) training of examples/pytorch_transformer.py's GPT-style
decoder with AdamW, the gradients' reduce-scatter made sparse by `gtopk_hvd.torch.fsdp`.

    torchrun --standalone --nproc_per_node 4 examples/fsdp_transformer.py \\
        --compression topk --density 0.01 --sparsify preconditioned

Each block is an FSDP unit and the root holds the embeddings, the final norm and the tied
decoder. The model, corpus, shards, schedule and seeds are examples/ddp_transformer.py's;
validation is over the whole validation text on every worker (FSDP's forward is a collective,
so every worker runs the same windows).

- `--compression none`: FSDP's own reduce-scatter.
- `--compression topk`: the sparse reduce-scatter at --density (each shard's top k of each
  worker's residual, sent to its owner); `--sparsify gradient` hands AdamW the averaged sparse
  update, `--sparsify preconditioned` freezes Adam's second moment after --dense-steps dense
  steps (`register(..., freeze_variance_after=, optimizer=, max_grad_norm=--clip)`: each
  worker then clips its own gradient, unit by unit); the loop clips only while
  `sparse.preconditioned` is False. `--residual-dtype bfloat16` halves the residuals.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import digits_common
import pytorch_lm
import pytorch_transformer
import torch
import torch.distributed as dist
from ddp_transformer import start_worker
from torch import nn
from torch.distributed.fsdp import fully_shard

from gtopk_hvd.torch import fsdp
from gtopk_hvd.torch.ddp import end_process_group

RESIDUAL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def more_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--residual-dtype", choices=sorted(RESIDUAL_DTYPES), default="float32",
                        help="what each worker's residual is kept in")


def perplexity(model: nn.Module, tokens: object, bptt: int) -> float:
    """Over the whole of `tokens`, the same windows on every worker."""
    total = pytorch_lm.loss_totals(model, tokens, bptt, 0, 1)
    return math.exp(total[0].item() / total[1].item())


def main() -> None:
    args = pytorch_transformer.parse_args(more=more_arguments,
                                          description=__doc__.splitlines()[0])
    if args.compression not in ("none", "topk"):
        sys.exit("examples/fsdp_transformer.py: --compression none (FSDP's reduce-scatter) or "
                 "topk (the sparse reduce-scatter: each shard's top k)")
    rank, workers, corpus, data, steps_per_epoch, total_steps, eval_every = start_worker(
        args, "examples/fsdp_transformer.py")
    total_steps = min_over_workers(total_steps)  # FSDP's collectives: the same count everywhere

    torch.manual_seed(args.seed)
    model = pytorch_transformer.build_model(args, len(corpus.vocab))
    params = sum(p.numel() for p in model.parameters())
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    torch.manual_seed(args.seed + 1 + rank)  # dropout masks differ between workers
    optimizer = pytorch_transformer.build_optimizer(args, model)
    sparse = None
    if args.compression != "none":
        preconditioned = args.sparsify == "preconditioned"
        sparse = fsdp.register(model, args.density,
                               residual_dtype=RESIDUAL_DTYPES[args.residual_dtype],
                               freeze_variance_after=args.dense_steps if preconditioned else None,
                               optimizer=optimizer if preconditioned else None,
                               max_grad_norm=args.clip if preconditioned else None)

    history, seconds, sent = [], 0.0, 0
    for step in range(total_steps):
        start = (step % steps_per_epoch) * args.bptt
        inputs, targets = data[start:start + args.bptt], data[start + 1:start + 1 + args.bptt]
        for group in optimizer.param_groups:
            group["lr"] = pytorch_transformer.learning_rate(args, step, total_steps)
        began = time.perf_counter()
        optimizer.zero_grad()
        loss = pytorch_lm.forward_backward(model, inputs, targets, [])
        if sparse is None or not sparse.preconditioned:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        seconds += time.perf_counter() - began
        before, sent = sent, (sparse.bytes_sent if sparse is not None else 0)
        if (step + 1) % eval_every == 0 or step + 1 == total_steps:
            history.append({"step": step + 1, "seconds": seconds, "loss": loss,
                            "valid_perplexity": perplexity(model, corpus.valid, args.bptt),
                            "bytes_per_step": (sent - before if sparse is not None
                                               else dense_bytes(model, workers))})
            if rank == 0 and not args.quiet:
                print(json.dumps(history[-1]), flush=True)

    test_ppl = perplexity(model, corpus.test, args.bptt)
    whole = fsdp.full_state(model)
    if rank == 0:
        pytorch_lm.write_history(
            args.history, params=params, workers=workers, steps=total_steps,
            steps_per_epoch=steps_per_epoch, test_perplexity=test_ppl, evaluations=history,
            dense_bytes_per_step=dense_bytes(model, workers),
            residual_bytes=0 if sparse is None else sparse.residual_bytes())
        digits_common.emit(
            f"RESULT compression={args.compression} workers={workers} steps={total_steps} "
            f"valid_perplexity={history[-1]['valid_perplexity']:.2f} "
            f"test_perplexity={test_ppl:.2f} bytes_per_step={history[-1]['bytes_per_step']} "
            f"dense_bytes_per_step={dense_bytes(model, workers)} params={params}")
    digits_common.emit(digits_common.checksum_line(
        rank, digits_common.sha256_hex(tensor.numpy() for tensor in whole.values())))


def min_over_workers(count: int) -> int:
    value = torch.tensor([count])
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


def dense_bytes(model: nn.Module, workers: int) -> int:
    """What FSDP's ring reduce-scatter sends a step, per worker, at float32: (P - 1) of each
    unit's padded shard."""
    total = 0
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        for group in (state()._fsdp_param_groups if state is not None else []):
            shard = sum(p.padded_sharded_param_size.numel() for p in group.fsdp_params)
            total += 4 * shard * (workers - 1)
    return total


if __name__ == "__main__":
    main()
    end_process_group()  # with the FSDP model out of scope: every rank, then the group
