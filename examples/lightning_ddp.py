"""PyTorch Lightning with the gTop-k DDP hook: an MLP on scikit-learn's digits.

    .venv/bin/python examples/lightning_ddp.py --devices 2 --epochs 10 --density 0.05 \\
        --checkpoints /tmp/ckpt                      # Lightning starts the 2 workers itself
    .venv/bin/python examples/lightning_ddp.py --devices 2 --epochs 12 --density 0.05 \\
        --resume /tmp/ckpt/epoch=9.ckpt              # goes on with every worker's residual

The Trainer gets `DDPStrategy(ddp_comm_state=state, ddp_comm_hook=gtopk_hook)` and
`GTopkHookCallback(state)` (`gtopk_hvd.torch.lightning`: it registers the hook where Lightning
does not, on CPU, and carries every worker's hook state in the checkpoints). --compression
none: Lightning's DDP without a hook. A checkpoint is written at the end of every epoch
(`epoch=N.ckpt`, N from 0). Every worker prints at the end its hook's iterations (HOOK_ITERS)
and a checksum of its weights (CHECKSUM); rank 0 the test accuracy (TEST_ACCURACY).
--drop-hook-state resumes without the saved hook states (every residual zero), to show what
they carry. `--optimizer adamw --freeze-variance-after N` is AdamW with the frozen second moment
(the callback gives the state Lightning's optimizer and its gradient_clip_val, --clip, as each
worker's clip in the sparse phase); `--precision bf16-mixed` Lightning's bf16 autocast.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import digits_common
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gtopk_hvd.compression import Compression
from gtopk_hvd.torch.ddp import GTopkHookState, gtopk_hook
from gtopk_hvd.torch.lightning import CHECKPOINT_KEY, GTopkHookCallback


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="workers (CPU processes)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--compression", choices=["gtopk", "topk", "none"], default="gtopk")
    parser.add_argument("--density", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data order")
    parser.add_argument("--checkpoints", type=Path, default=None,
                        help="write epoch=N.ckpt here at the end of every epoch")
    parser.add_argument("--resume", type=Path, default=None, help="a checkpoint to go on from")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                        help="SGD with momentum 0.9, or AdamW (weight decay 0.01)")
    parser.add_argument("--freeze-variance-after", type=int, default=None, metavar="N",
                        help="--optimizer adamw: N dense steps, then Adam's second moment "
                             "frozen and the preconditioned gradient reduced (the state's "
                             "freeze_variance_after)")
    parser.add_argument("--precision", default="32-true", help="Lightning's, e.g. bf16-mixed")
    parser.add_argument("--clip", type=float, default=None,
                        help="Lightning's gradient_clip_val (by norm)")
    parser.add_argument("--drop-hook-state", action="store_true",
                        help="resume without the saved hook states (zero residuals)")
    return parser.parse_args()


class DigitsMLP(pl.LightningModule):
    def __init__(self, lr: float, optimizer: str = "sgd") -> None:
        super().__init__()
        self.lr, self.optimizer_name = lr, optimizer
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(),
                                 nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer_name == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class ZeroResidualsOnResume(GTopkHookCallback):
    """--drop-hook-state: resumes with the saved job's hook state but every residual and
    velocity zero (rank 0's state with keep_residuals=False on every rank)."""

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict) -> None:
        self.state.load_state_dict(checkpoint[CHECKPOINT_KEY]["states"][0],
                                   keep_residuals=False)


def main() -> None:
    args = parse_args()
    pl.seed_everything(args.seed, verbose=False)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = digits_common.load_digits_split((64,))
    train = DataLoader(TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
                       batch_size=args.batch_size, shuffle=True)
    model = DigitsMLP(args.lr, args.optimizer)
    callbacks: list[pl.Callback] = []
    if args.checkpoints is not None:
        callbacks.append(ModelCheckpoint(dirpath=args.checkpoints, filename="{epoch}",
                                         save_top_k=-1, every_n_epochs=1))
    state = None
    if args.compression == "none":
        strategy = DDPStrategy(process_group_backend="gloo")
    else:
        state = GTopkHookState(compression=getattr(Compression, args.compression)(args.density),
                               freeze_variance_after=args.freeze_variance_after)
        strategy = DDPStrategy(ddp_comm_state=state, ddp_comm_hook=gtopk_hook,
                               process_group_backend="gloo")
        callbacks.append((ZeroResidualsOnResume if args.drop_hook_state
                          else GTopkHookCallback)(state))
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy,
                         max_epochs=args.epochs, callbacks=callbacks, logger=False,
                         precision=args.precision, gradient_clip_val=args.clip,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=args.checkpoints is not None)
    trainer.fit(model, train, ckpt_path=args.resume)

    rank = trainer.global_rank
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(x_test)).argmax(1) == torch.from_numpy(y_test))
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    if state is not None:
        print(f"HOOK_ITERS rank={rank} {state.iter} preconditioned={state.preconditioned}",
              flush=True)
    print(f"CHECKSUM rank={rank} {digest.hexdigest()}", flush=True)
    if rank == 0:
        print(f"TEST_ACCURACY {accuracy.float().mean().item():.4f}", flush=True)


if __name__ == "__main__":
    main()
