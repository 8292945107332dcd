"""What differs between torch 1.13 and torch 2.x for the backend "gradd"'s
registration (the C++ side's differences are in c10d/torch_compat.h).

torch 2.x's ``Backend.register_backend`` takes the devices a backend serves:
gradd registers ``["cpu"]``, so torch's ProcessGroup routes CPU tensors to it
and refuses others itself (1.13 has no such argument: ProcessGroupGradd
refuses them). A creator registered with ``extended_api=True`` gets a
``DistributedBackendOptions`` and the backend options instead of
``(store, rank, size, timeout)``; gradd does not ask for that, but
``creator_args`` reads both.

Checked by feature (the signature, the attributes), not by version.
"""
from __future__ import annotations

import inspect

import torch.distributed as dist

DEVICES = ["cpu"]


def register(name, creator) -> None:
    """Registers `creator` as the backend `name` for CPU tensors."""
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:
        dist.Backend.register_backend(name, creator, devices=DEVICES)
    else:
        dist.Backend.register_backend(name, creator)


def creator_args(args):
    """(store, rank, size, timeout) from a creator's positional arguments."""
    if len(args) == 4:
        return tuple(args)
    if len(args) in (1, 2) and hasattr(args[0], "group_rank"):
        o = args[0]  # DistributedBackendOptions (extended_api=True)
        return o.store, o.group_rank, o.group_size, o.timeout
    raise TypeError(
        "gradd backend: the creator takes (store, rank, size, timeout) or "
        f"(DistributedBackendOptions, options); got {len(args)} arguments")
