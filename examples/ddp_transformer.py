"""torchrun + DDP training of examples/pytorch_transformer.py's GPT-style decoder with AdamW, the
sparse scheme on DDP's communication hook, no Horovod.

    torchrun --standalone --nproc_per_node 4 examples/ddp_transformer.py \\
        --compression topk --density 0.01 --sparsify preconditioned

The model, corpus, shards, learning-rate schedule, seeds and evaluation are the Horovod
example's, so the two runs are the same configuration through the two paths; what differs is
the place of the sparse step:

- `--sparsify gradient`: gtopk_hook sparsifies each DDP bucket's gradient and AdamW steps on
  the averaged sparse update;
- `--sparsify preconditioned`: `GTopkHookState(freeze_variance_after=--dense-steps,
  optimizer=..., max_grad_norm=--clip)`: --dense-steps dense AdamW steps, then Adam's second
  moment is frozen and each bucket's gradient divided by sqrt(v_hat) + eps is what the scheme
  reduces (`gtopk_hvd.torch.hook_optimizer`); each worker clips its own gradient inside the
  hook then, and the loop clips only while `state.preconditioned` is False.

With --bucket-cap-mb large enough for one bucket (the default here, 1024), every sparse step
selects over the whole gradient as the Horovod optimizer does, and the two paths end with the
same weights (tests/torch/test_hook_adamw.py). `--compression none` is DDP's own all-reduce.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import digits_common
import pytorch_lm
import pytorch_transformer
import torch
import torch.distributed as dist
from sparse_options import sparse_compression
from stdlib_corpus import load_corpus
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gtopk_hvd.torch.ddp import GTopkHookState, end_process_group, gtopk_hook


def more_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bucket-cap-mb", type=float, default=1024.0,
                        help="DDP's bucket_cap_mb (the first bucket too); the default makes one "
                             "bucket of the whole gradient, the Horovod optimizer's selection")


def perplexity(model: nn.Module, tokens: object, bptt: int) -> float:
    total = pytorch_lm.loss_totals(model, tokens, bptt, dist.get_rank(), dist.get_world_size())
    dist.all_reduce(total)
    return math.exp(total[0].item() / total[1].item())


def main() -> None:
    args = pytorch_transformer.parse_args(more=more_arguments,
                                          description=__doc__.splitlines()[0])
    rank, workers, corpus, data, steps_per_epoch, total_steps, eval_every = start_worker(
        args, "examples/ddp_transformer.py")

    torch.manual_seed(args.seed)
    model = pytorch_transformer.build_model(args, len(corpus.vocab))
    torch.manual_seed(args.seed + 1 + rank)  # dropout masks differ between workers
    optimizer = pytorch_transformer.build_optimizer(args, model)
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    state = None
    if args.compression not in digits_common.DENSE:
        preconditioned = args.sparsify == "preconditioned"
        state = GTopkHookState(
            compression=sparse_compression(args, steps_per_epoch),
            freeze_variance_after=args.dense_steps if preconditioned else None,
            optimizer=optimizer, max_grad_norm=args.clip if preconditioned else None)
        ddp.register_comm_hook(state, gtopk_hook)
    params = sum(p.numel() for p in model.parameters())

    history, seconds = [], 0.0
    for step in range(total_steps):
        start = (step % steps_per_epoch) * args.bptt
        inputs, targets = data[start:start + args.bptt], data[start + 1:start + 1 + args.bptt]
        for group in optimizer.param_groups:
            group["lr"] = pytorch_transformer.learning_rate(args, step, total_steps)
        began = time.perf_counter()
        optimizer.zero_grad()
        loss = pytorch_lm.forward_backward(ddp, inputs, targets, [])
        if state is None or not state.preconditioned:  # after it: the hook clipped each worker's
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        seconds += time.perf_counter() - began
        if (step + 1) % eval_every == 0 or step + 1 == total_steps:
            history.append({"step": step + 1, "seconds": seconds, "loss": loss,
                            "valid_perplexity": perplexity(model, corpus.valid, args.bptt),
                            "bytes_per_step": bytes_per_step(state, params, workers)})
            if rank == 0 and not args.quiet:
                print(json.dumps(history[-1]), flush=True)

    test_ppl = perplexity(model, corpus.test, args.bptt)
    if rank == 0:
        pytorch_lm.write_history(args.history, params=params, workers=workers,
                                 steps=total_steps, steps_per_epoch=steps_per_epoch,
                                 test_perplexity=test_ppl, evaluations=history)
        digits_common.emit(
            f"RESULT compression={args.compression} workers={workers} steps={total_steps} "
            f"valid_perplexity={history[-1]['valid_perplexity']:.2f} "
            f"test_perplexity={test_ppl:.2f} bytes_per_step={history[-1]['bytes_per_step']} "
            f"params={params}")
        if args.save:
            pytorch_lm.save_parameters(args.save, model)
    digits_common.emit(digits_common.checksum_line(rank, pytorch_lm.parameters_checksum(model)))
    end_process_group()


def start_worker(args: argparse.Namespace, example: str) -> tuple:
    """Under torchrun: the Gloo group, this worker's shard of the corpus and the run's length:
    (rank, P, corpus, data, steps a epoch, steps, steps between validations)."""
    if "LOCAL_RANK" not in os.environ:
        sys.exit(f"{example} runs under torchrun: torchrun --standalone --nproc_per_node N "
                 f"{example} ...")
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, workers = dist.get_rank(), dist.get_world_size()
    corpus = load_corpus(args.vocab_size)
    data = pytorch_lm.batchify(pytorch_lm.worker_shard(corpus.train, rank, workers),
                               args.batch_size)
    steps_per_epoch = (data.size(0) - 1) // args.bptt
    total_steps, eval_every = pytorch_lm.run_length(args, steps_per_epoch)
    return rank, workers, corpus, data, steps_per_epoch, total_steps, eval_every


def bytes_per_step(state: GTopkHookState | None, params: int, workers: int) -> int:
    """Bytes this worker sent in the last step: its buckets' sparse steps, or a ring
    all-reduce of the float32 gradient (dense, and the dense start)."""
    if state is None or not state.last_stats:
        return 2 * (workers - 1) * 4 * params // workers
    return sum(stats.bytes_sent for stats in state.last_stats.values())


if __name__ == "__main__":
    main()
