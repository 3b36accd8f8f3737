"""Hugging Face: the DDP hook under transformers' `Trainer` and accelerate's `Accelerator`.

    from gtopk_hvd.torch.ddp import GTopkHookState
    from gtopk_hvd.torch.hf import register_on_accelerator, register_on_trainer

    state = GTopkHookState(density=0.01, freeze_variance_after=100)   # AdamW's remedy

    trainer = Trainer(model=model, args=args, train_dataset=train)   # under torchrun
    register_on_trainer(trainer, state)
    trainer.train()                       # or trainer.train(resume_from_checkpoint=True)

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    register_on_accelerator(accelerator, model, state)
    ...  accelerator.save_state(directory) / accelerator.load_state(directory)

Both register `gtopk_hook` with `state` on the DDP model the client built, give the state the
client's optimizer (`GTopkHookState.attach_optimizer`: a skipped iteration is not applied, and
freeze_variance_after takes over the step), and keep every worker's hook state in the client's
own checkpoints: each worker writes `gtopk_hook_rank{r}.pt` (its `state_dict()` and the number
of workers) into the checkpoint's folder, and on resume reads its own; a worker the saved job
did not have reads rank 0's without residuals (`load_state_dict(keep_residuals=False)`), so a
job resumed on another number of workers issues the same collectives on every worker.

Trainer: the callback registers at `on_train_begin` (after the Trainer built DDP and loaded a
checkpoint); the state is saved and loaded where the Trainer saves and loads the optimizer, in
the checkpoint's folder, on every rank (its `_save_optimizer_and_scheduler(folder)` and
`_load_optimizer_and_scheduler(folder)`, wrapped on this trainer). With freeze_variance_after,
the Trainer's gradient clipping (max_grad_norm) applies to the dense start's reduced gradient
only; in the sparse phase it becomes the state's
`max_grad_norm` (each worker clips its own gradient inside the hook; not with fp16's GradScaler,
whose scaled gradient the hook sees: no clip there) and the Trainer's is set to 0 for those
steps (restored when training ends).

accelerate: `save_state` / `load_state` run the registered pre-hooks on every process, which
write and read the files. Clip with `accelerator.clip_grad_norm_` only while
`state.preconditioned` is False.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gtopk_hvd.torch.ddp import GTopkHookState, register_once

STATE_FILE = "gtopk_hook_rank{rank}.pt"
"""Each worker's hook state in a checkpoint's folder."""


def _rank_and_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def save_worker_state(state: GTopkHookState, directory: str) -> str:
    """Writes this worker's hook state into `directory` as `STATE_FILE` of its rank.

    Args:
        state: the GTopkHookState registered with the hook.
        directory: the checkpoint's folder (made if missing).

    Returns:
        The path of the file written.
    """
    rank, size = _rank_and_size()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, STATE_FILE.format(rank=rank))
    torch.save({"workers": size, "state": state.state_dict()}, path)
    return path


def load_worker_state(state: GTopkHookState, directory: str) -> None:
    """Reads this worker's hook state from `directory` into `state`: the file of its rank, or,
    for a rank the saved job did not have, rank 0's without residuals (module docstring).

    Args:
        state: the GTopkHookState registered with the hook.
        directory: the checkpoint's folder that `save_worker_state` wrote into.

    Raises:
        FileNotFoundError: the folder holds no hook state (rank 0's file is missing).
        ValueError: the saved state was made with another compression.
    """
    rank, _ = _rank_and_size()
    own = os.path.join(directory, STATE_FILE.format(rank=rank))
    first = os.path.join(directory, STATE_FILE.format(rank=0))
    if not os.path.exists(first):
        raise FileNotFoundError(
            f"gtopk_hvd: the checkpoint {directory} has no {STATE_FILE.format(rank=0)}: it was "
            "not saved with the hook registered by gtopk_hvd.torch.hf, so the workers' "
            "residuals are not in it")
    saved = torch.load(own if os.path.exists(own) else first, weights_only=False)
    keep = os.path.exists(own) and rank < saved["workers"]
    state.load_state_dict(saved["state"], keep_residuals=keep)


def _register(model: Any, state: GTopkHookState, optimizer: Any, client: str) -> None:
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper of the DDP model
    if not isinstance(state, GTopkHookState):
        raise TypeError(f"gtopk_hvd: {client} takes the GTopkHookState for the hook, got "
                        f"{type(state).__name__}")
    if not isinstance(model, DistributedDataParallel):
        raise RuntimeError(
            f"gtopk_hvd: {client}: the model is a {type(model).__name__}, not DDP: run under "
            "torchrun with more than one process (a single process has no DDP and nothing to "
            "reduce), and not with FSDP or DeepSpeed")
    register_once(model, state, f"{client} registers gtopk_hook with the state it is given")
    if optimizer is not None:
        state.attach_optimizer(optimizer)


# -- accelerate -----------------------------------------------------------------------------

def register_on_accelerator(accelerator: Any, model: Any, state: GTopkHookState) -> None:
    """Registers gtopk_hook with `state` on the prepared DDP model, attaches the accelerator's
    optimizer (when it prepared exactly one) and keeps every worker's hook state in
    `save_state` / `load_state` (module docstring). Call after prepare, before the first
    backward.

    Args:
        accelerator: the `accelerate.Accelerator` that prepared the model.
        model: the model `accelerator.prepare` returned (DDP, or torch.compile's wrapper of
            it).
        state: the GTopkHookState for the hook.

    Raises:
        TypeError: `state` is not a GTopkHookState.
        RuntimeError: the model is not DDP (one process, FSDP, DeepSpeed); the model has
            another communication hook or state; freeze_variance_after without an optimizer
            on the state while the accelerator prepared other than one.
        ValueError: the optimizer is refused by `GTopkHookState.attach_optimizer`.
    """
    optimizers = list(getattr(accelerator, "_optimizers", []))
    if state.optimizer_link.after is not None and state.optimizer_link.optimizer is None \
            and len(optimizers) != 1:
        raise RuntimeError(
            f"gtopk_hvd: register_on_accelerator: freeze_variance_after needs the optimizer and "
            f"the accelerator prepared {len(optimizers)}: give it to the state "
            "(GTopkHookState(..., optimizer=optimizer))")
    _register(model, state, optimizers[0] if len(optimizers) == 1 else None,
              "register_on_accelerator")
    accelerator.register_save_state_pre_hook(
        lambda models, weights, directory: save_worker_state(state, directory))
    accelerator.register_load_state_pre_hook(
        lambda models, directory: load_worker_state(state, directory))


# -- transformers' Trainer --------------------------------------------------------------------

def register_on_trainer(trainer: Any, state: GTopkHookState) -> Any:
    """Adds the callback that registers gtopk_hook with `state` on the Trainer's DDP model and
    keeps the hook state in the Trainer's checkpoints (module docstring). Call before
    `trainer.train()`.

    Args:
        trainer: the `transformers.Trainer`.
        state: the GTopkHookState for the hook.

    Returns:
        The callback added (`trainer_callback`).

    Raises:
        TypeError: `state` is not a GTopkHookState.
        RuntimeError: a Trainer without the checkpoint methods the state is saved through;
            at `train()`, a model that is not DDP, or a resumed checkpoint without hook state.
    """
    callback = trainer_callback(trainer, state)
    trainer.add_callback(callback)
    return callback


def trainer_callback(trainer: Any, state: GTopkHookState) -> Any:
    """The `TrainerCallback` of `register_on_trainer`, the Trainer's checkpoint methods wrapped
    to save and load the hook state (transformers imported here only).

    Args:
        trainer: the `transformers.Trainer`.
        state: the GTopkHookState for the hook.

    Returns:
        The callback, not yet added to the Trainer.

    Raises:
        TypeError: `state` is not a GTopkHookState.
        RuntimeError: a Trainer without `_save_optimizer_and_scheduler` /
            `_load_optimizer_and_scheduler`.
    """
    from transformers import TrainerCallback

    if not isinstance(state, GTopkHookState):
        raise TypeError(f"gtopk_hvd: register_on_trainer takes the GTopkHookState for the hook, "
                        f"got {type(state).__name__}")
    save = getattr(trainer, "_save_optimizer_and_scheduler", None)
    load = getattr(trainer, "_load_optimizer_and_scheduler", None)
    if save is None or load is None:
        raise RuntimeError("gtopk_hvd: register_on_trainer: this transformers Trainer has no "
                           "_save_optimizer_and_scheduler / _load_optimizer_and_scheduler, "
                           "where the hook state is saved into each checkpoint's folder and "
                           "loaded on resume; use transformers 4.30 to 5.x")

    class GTopkTrainerCallback(TrainerCallback):
        """The hook on the Trainer's DDP model, its state in the Trainer's checkpoints."""

        def __init__(self) -> None:
            self.loaded_from: str | None = None
            self.trainer_clip: float | None = None

        def on_train_begin(self, args: Any, trainer_state: Any, control: Any,
                           **kwargs: Any) -> None:
            _register(trainer.model_wrapped, state, kwargs.get("optimizer"),
                      "register_on_trainer")
            if trainer_state.global_step > 0 and self.loaded_from is None:
                raise RuntimeError(
                    f"gtopk_hvd: the Trainer resumed at step {trainer_state.global_step} but "
                    "loaded no hook state: the checkpoint was saved without "
                    "register_on_trainer, so the workers' residuals are lost")
            link = state.optimizer_link
            scaled = bool(getattr(args, "fp16", False))  # a GradScaler: the hook would clip
            if (link.after is not None and args.max_grad_norm and args.max_grad_norm > 0
                    and link.max_grad_norm is None and not scaled):
                link.set_clip(float(args.max_grad_norm))
            self.trainer_clip = args.max_grad_norm

        def on_step_begin(self, args: Any, trainer_state: Any, control: Any,
                          **kwargs: Any) -> None:
            # The Trainer clips after backward: the reduced gradient in the dense start, never
            # the reduced update of the sparse phase (the hook clipped each worker's then).
            args.max_grad_norm = 0.0 if state.preconditioned else self.trainer_clip

        def on_train_end(self, args: Any, trainer_state: Any, control: Any,
                         **kwargs: Any) -> None:
            args.max_grad_norm = self.trainer_clip

    callback = GTopkTrainerCallback()

    def save_with_hook_state(directory: str) -> None:
        save(directory)
        save_worker_state(state, directory)

    def load_with_hook_state(checkpoint: str | None) -> None:
        load(checkpoint)
        if checkpoint is not None:
            load_worker_state(state, checkpoint)
            callback.loaded_from = checkpoint

    trainer._save_optimizer_and_scheduler = save_with_hook_state
    trainer._load_optimizer_and_scheduler = load_with_hook_state
    return callback


__all__ = ["STATE_FILE", "load_worker_state", "register_on_accelerator", "register_on_trainer",
           "save_worker_state", "trainer_callback"]
