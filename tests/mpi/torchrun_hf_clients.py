"""Launched by torchrun (tests/torch/test_hf_clients.py): a tiny GPT-2 built from a config (nothing
downloaded) trained on the standard library's text by transformers' `Trainer` or by an
accelerate loop, with AdamW, bf16 autocast on the CPU and gtopk_hook registered the documented
way (`gtopk_hvd.torch.hf`) with freeze_variance_after.

Three runs in one launch, each with a new model, optimizer, DDP and hook state:
  full     --steps steps without a stop;
  first    the same run, stopped after --steps / 2 steps, its checkpoint saved (Trainer's
           save_steps; accelerate's save_state);
  resumed  a new run that resumes from that checkpoint (Trainer's resume_from_checkpoint;
           accelerate's load_state) and goes on to --steps.

Every worker prints `CHECKSUM run=<run> rank=<r> <sha256 of its weights>`, `LOSS run=<run>
first=<loss> last=<loss>`, whether the last step was preconditioned, and its hook-state file's
residual norm; the test compares them.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from stdlib_corpus import load_corpus  # noqa: E402

from gtopk_hvd.compression import Compression  # noqa: E402
from gtopk_hvd.torch.ddp import GTopkHookState, end_process_group  # noqa: E402
from gtopk_hvd.torch.hf import STATE_FILE, register_on_accelerator, register_on_trainer  # noqa: E402,I001

CONTEXT = 32
VOCAB = 500


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", choices=["trainer", "accelerate"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--dense-steps", type=int, default=4)
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--compression", default="topk")
    return parser.parse_args()


class Windows(torch.utils.data.Dataset):
    """Consecutive windows of CONTEXT tokens of the corpus (the same on every worker; the
    client's sampler shards them)."""

    def __init__(self, count: int) -> None:
        tokens = torch.from_numpy(load_corpus(VOCAB).train[:count * CONTEXT].astype("int64"))
        self.windows = tokens.view(count, CONTEXT)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[index], "labels": self.windows[index]}


def build_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return GPT2LMHeadModel(config)


def new_state(args: argparse.Namespace) -> GTopkHookState:
    compression = getattr(Compression, args.compression)(args.density)
    return GTopkHookState(compression=compression, freeze_variance_after=args.dense_steps)


def digest(model: torch.nn.Module) -> str:
    return hashlib.sha256(b"".join(p.detach().float().numpy().tobytes()
                                   for p in model.parameters())).hexdigest()


def report(run: str, model: torch.nn.Module, state: GTopkHookState, losses: list[float]) -> None:
    rank = dist.get_rank()
    print(f"CHECKSUM run={run} rank={rank} {digest(model)}", flush=True)
    print(f"LOSS run={run} rank={rank} first={losses[0]:.4f} last={losses[-1]:.4f}", flush=True)
    print(f"PRECONDITIONED run={run} rank={rank} {state.preconditioned} iter={state.iter}",
          flush=True)


# -- transformers' Trainer ------------------------------------------------------------------

def trainer_run(args: argparse.Namespace, run: str) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    output = os.path.join(args.out, "trainer")
    losses: list[float] = []

    class Record(TrainerCallback):
        def on_log(self, _args: object, state: object, control: object, logs: dict = None,
                   **kwargs: object) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

        def on_step_end(self, _args: object, state: object, control: object,
                        **kwargs: object) -> None:
            if run == "first" and state.global_step == args.steps // 2:
                control.should_save = True
                control.should_training_stop = True

    training = TrainingArguments(
        output_dir=output, max_steps=args.steps, per_device_train_batch_size=4,
        learning_rate=3e-3, weight_decay=0.1, warmup_steps=2, lr_scheduler_type="cosine",
        optim="adamw_torch", max_grad_norm=1.0, bf16=True, use_cpu=True, ddp_backend="gloo",
        logging_steps=1, save_strategy="no", report_to=[], seed=7, data_seed=7,
        dataloader_num_workers=0, disable_tqdm=True)
    state = new_state(args)
    trainer = Trainer(model=build_model(), args=training, train_dataset=Windows(128),
                      callbacks=[Record()])
    register_on_trainer(trainer, state)
    resume = os.path.join(output, f"checkpoint-{args.steps // 2}") if run == "resumed" else None
    trainer.train(resume_from_checkpoint=resume)
    report(run, trainer.model, state, losses or [float("nan")])


# -- accelerate -----------------------------------------------------------------------------

def accelerate_run(args: argparse.Namespace, run: str) -> None:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(7)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    loader = torch.utils.data.DataLoader(Windows(128), batch_size=4, shuffle=True,
                                         generator=torch.Generator().manual_seed(7))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + 0.05 * step))
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
    state = new_state(args)
    register_on_accelerator(accelerator, model, state)
    checkpoint = os.path.join(args.out, "accelerate", "checkpoint")
    start = 0
    if run == "resumed":
        accelerator.load_state(checkpoint)
        start = args.steps // 2
    losses: list[float] = []
    batches = iter(accelerator.skip_first_batches(loader, start) if start else loader)
    for _ in range(start, args.steps if run != "first" else args.steps // 2):
        batch = next(batches)
        with accelerator.autocast():
            loss = model(**batch).loss
        accelerator.backward(loss)
        if not state.preconditioned:  # the dense start: clip the reduced gradient
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    if run == "first":
        accelerator.save_state(checkpoint)
        accelerator.wait_for_everyone()
    report(run, accelerator.unwrap_model(model), state, losses)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    run_one = trainer_run if args.client == "trainer" else accelerate_run
    for run in ("full", "first", "resumed"):
        run_one(args, run)
        dist.barrier()
        if run == "first" and dist.get_rank() == 0:
            folder = (os.path.join(args.out, "trainer", f"checkpoint-{args.steps // 2}")
                      if args.client == "trainer" else
                      os.path.join(args.out, "accelerate", "checkpoint"))
            files = sorted(name for name in os.listdir(folder) if name.startswith("gtopk_hook"))
            print(f"HOOK_FILES {' '.join(files)} expected {STATE_FILE}", flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
