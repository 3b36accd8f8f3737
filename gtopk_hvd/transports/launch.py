"""A transport for a command-line tool, its library initialised here (the tool has no training
script to do it): for the benchmarks and the test programs.

    mpi      mpirun (or a single process): MPI over mpi4py
    horovod  horovodrun --gloo / --mpi or mpirun: hvd.init() of horovod.torch, Horovod's
             collectives
    torch    torchrun: init_process_group("gloo") from torchrun's environment
"""

from __future__ import annotations

from gtopk_hvd.transports import Transport, resolve_transport

LAUNCHABLE = ("mpi", "horovod", "torch")
_opened: set[str] = set()  # what open_transport initialised, for close_transports


def open_transport(name: str) -> Transport:
    """Initialises what the named transport runs on (if not yet) and returns the transport."""
    if name == "horovod":
        import horovod.torch as hvd

        if not hvd.is_initialized():
            hvd.init()
        return resolve_transport(name, hvd)
    if name == "torch":
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
            _opened.add(name)
        return resolve_transport("torch")
    if name == "mpi":
        return resolve_transport(name)
    raise ValueError(f"unknown transport {name!r}; one of {LAUNCHABLE}")


def close_transports() -> None:
    """At a tool's normal end, on every worker: takes down what open_transport initialised
    (a torch.distributed group left to the interpreter's exit may abort its Gloo threads)."""
    if "torch" in _opened:
        from gtopk_hvd.transports.torch_distributed import end_process_group

        end_process_group()
        _opened.discard("torch")
