"""PyTorch Lightning: the DDP hook in a Trainer, and its state in Lightning's checkpoints.

    from lightning.pytorch.strategies import DDPStrategy
    from gtopk_hvd.torch.ddp import GTopkHookState, gtopk_hook
    from gtopk_hvd.torch.lightning import GTopkHookCallback

    state = GTopkHookState(density=0.01)
    trainer = Trainer(strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=gtopk_hook),
                      callbacks=[GTopkHookCallback(state)], ...)

The callback does three things Lightning does not:

- Registration on every device. Lightning's `DDPStrategy` registers `ddp_comm_hook` only when
  the model is on a CUDA device, and otherwise trains with DDP's dense all-reduce without a
  word; at fit start the callback registers `gtopk_hook` with its state on the DDP model if the
  strategy has not (and refuses a strategy that registered another hook or state). On CPU,
  `strategy="ddp"` with the callback is enough.
- Checkpoints. Lightning saves the model, optimizers and callbacks' states from rank 0; the
  hook's residuals differ between workers. At every checkpoint the callback gathers every
  worker's `state.state_dict()` into `checkpoint["gtopk_hook"]` = {"workers": P, "states": [one
  per rank]} (one all-gather, on every rank: Lightning builds the checkpoint on all of them); on
  resume (`fit(ckpt_path=...)`) rank r loads the state rank r saved, and a rank the saved job did
  not have loads rank 0's without residuals (`GTopkHookState.load_state_dict`'s
  `keep_residuals=False`), so a job resumed on another number of workers runs the same
  collectives on every worker.
- A skipped iteration is not applied. With nonfinite="propagate" an iteration in which some
  worker's gradient held a NaN/Inf comes back all NaN on every worker. A GradScaler
  (`precision="16-mixed"`) then skips the step; without one (`"bf16-mixed"`, `"32-true"`)
  nothing would, so before the optimizer's step the callback sets the gradients of that
  optimizer's parameters to None when the hook skipped the iteration: torch's optimizers pass
  over a parameter without a gradient, so no weight, moment or step count changes, on every
  worker alike. This reads the skip on the host once an iteration (a wait for the device after
  backward), as gtopk_hvd.torch.DistributedOptimizer's step does.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from gtopk_hvd.torch.ddp import GTopkHookState, register_once

CHECKPOINT_KEY = "gtopk_hook"


class GTopkHookCallback(Callback):
    """Registers gtopk_hook with `state` where Lightning did not, and keeps every worker's
    hook state in Lightning's checkpoints (module docstring).

    Args:
        state: the GTopkHookState given to the hook (the same as DDPStrategy's
            `ddp_comm_state`, if given there).

    Raises:
        TypeError: `state` is not a GTopkHookState.
        RuntimeError: at fit start, a strategy that is not DDP, or one that registered another
            hook or state; freeze_variance_after without an optimizer on the state while the
            module configured other than one.
        ValueError: at fit start, freeze_variance_after's clip with a
            gradient_clip_algorithm other than "norm".
        KeyError: on resume, a checkpoint saved without the callback.
    """

    def __init__(self, state: GTopkHookState) -> None:
        if not isinstance(state, GTopkHookState):
            raise TypeError(f"GTopkHookCallback takes the GTopkHookState given to the hook, "
                            f"got {type(state).__name__}")
        self.state = state

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            raise RuntimeError(f"GTopkHookCallback needs a DDP strategy (strategy=\"ddp\" or "
                               f"DDPStrategy), the model is a {type(model).__name__}")
        register_once(model, self.state, "give DDPStrategy ddp_comm_hook=gtopk_hook and "
                                         "GTopkHookCallback's state, or neither")
        link = self.state.optimizer_link
        if link.optimizer is None and len(trainer.optimizers) == 1:
            self.state.attach_optimizer(trainer.optimizers[0])
        elif link.after is not None and link.optimizer is None:
            raise RuntimeError(f"GTopkHookCallback: freeze_variance_after needs the optimizer "
                               f"and the module configured {len(trainer.optimizers)}: give it "
                               "to the state (state.attach_optimizer(optimizer))")
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if (link.after is not None and link.max_grad_norm is None and trainer.gradient_clip_val
                and scaler is None):  # with a scaler the hook would clip the scaled gradient
            if trainer.gradient_clip_algorithm not in (None, "norm"):
                raise ValueError("GTopkHookCallback: freeze_variance_after clips each worker's "
                                 "own gradient by its norm in the sparse phase; "
                                 f"gradient_clip_algorithm={trainer.gradient_clip_algorithm!r}"
                                 " is not supported there (use \"norm\")")
            link.set_clip(float(trainer.gradient_clip_val))

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule,
                                 optimizer: Optimizer) -> None:
        """A skipped iteration's step changes nothing where no scaler skips it (module
        docstring)."""
        link = self.state.optimizer_link
        if link.optimizer is not None:
            if link.serves(optimizer):
                # step() runs the backward in its closure, after the optimizer's pre-hook: the
                # frozen rule's step (or the skip) is taken here, on gradients a scaler has
                # already unscaled, and Lightning's clip and the optimizer's own step then find
                # no gradient (a scaler that found a NaN/Inf skips a step that then changes
                # nothing: the hook's skip saw the same NaN/Inf).
                link.apply()
            return
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return  # the scaler skips the step
        if self.state.last_iteration_skipped:
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    parameter.grad = None

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        states: list[Any] = [self.state.state_dict()]
        if dist.is_initialized():
            mine, states = states[0], [None] * dist.get_world_size()
            dist.all_gather_object(states, mine)
        checkpoint[CHECKPOINT_KEY] = {"workers": len(states), "states": states}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(CHECKPOINT_KEY)
        if saved is None:
            raise KeyError(f"the checkpoint has no {CHECKPOINT_KEY!r}: it was not saved with a "
                           "GTopkHookCallback, so the workers' residuals are not in it")
        rank = dist.get_rank() if dist.is_initialized() else 0
        own = rank < saved["workers"]
        self.state.load_state_dict(saved["states"][rank if own else 0], keep_residuals=own)
