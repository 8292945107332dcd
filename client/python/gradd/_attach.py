"""Attaching a gradd.torch.DistributedDataParallel's parameters to the
node's daemon: the client library's ``attach`` call with the DDP's settings,
and the check that the daemon placed this trainer where the process group
(or the environment) says.

Given explicitly what it needs (the placement from gradd/_world.py, the
module and its parameters, the attach options); it returns the client and
knows nothing of the DDP object.
"""
from __future__ import annotations

from typing import List, Tuple

import torch

import gradd._C as _C
from gradd import _state_sync, _world
from gradd._C import GraddError
from gradd._params import DTYPES

_MiB = 1 << 20


def resolve_world(process_group, device: torch.device, opts: dict):
    """The DDP's placement (gradd/_world.py) from its process group (None:
    the default group, else the environment) and its ``_attach_options``."""
    keys = ("socket", "job_id", "rank", "world_size", "local_rank", "local_world_size",
            "node_rank", "coordinator")
    return _world.resolve(process_group, device=device, **{k: opts[k] for k in keys})


def broadcast_bytes(module: torch.nn.Module, world_size: int, chunk_mb: float) -> int:
    """The broadcast area to ask for: the module's state, at least 4 KiB, at
    most `chunk_mb` (0 for a job of one rank: nothing is broadcast)."""
    if world_size <= 1:
        return 0
    state = _state_sync.state_bytes(_state_sync.module_states(module))
    return int(max(4096, min(state, chunk_mb * _MiB)))


def attach_client(
    world,
    module: torch.nn.Module,
    names: List[str],
    params: List[torch.nn.Parameter],
    *,
    device: torch.device,
    device_ids,
    bucket_cap_mb: float,
    opts: dict,
    bucket_cap_auto: bool = False,
) -> Tuple[object, int]:
    """(the attached client, its broadcast area's size in bytes) for the
    DDP placed as `world` (a gradd._world.World); `opts` is the DDP's
    ``_attach_options``. Raises GraddError when the daemon placed this
    trainer at another rank or world size than `world` says."""
    cuda = device.type == "cuda"
    # (name, shape, dtype), plus the device for CUDA modules.
    specs = [
        (n, tuple(p.shape), DTYPES[p.dtype]) + (("cuda",) if cuda else ())
        for n, p in zip(names, params)
    ]
    bcast = broadcast_bytes(module, world.world_size, opts["broadcast_chunk_mb"])
    multi = world.num_nodes > 1
    client = _C.attach(
        specs,
        socket=opts["socket"] or "",
        job_id=world.job_id,
        local_rank=world.local_rank,
        local_world_size=world.local_world_size,
        bucket_cap_mb=float(bucket_cap_mb),
        first_bucket_cap_mb=float(opts["first_bucket_cap_mb"] or 0.0),
        broadcast_bytes=bcast,
        connect_timeout=opts["connect_timeout"],
        attach_timeout=opts["attach_timeout"],
        wait_timeout=opts["wait_timeout"],
        node_rank=world.node_rank if multi else None,
        num_nodes=world.num_nodes,
        coordinator=world.coordinator if multi else "",
        world_size=world.world_size,
        rank=world.rank,
        # Always: the used map also serves static_graph, which
        # _set_static_graph() may turn on after construction.
        find_unused_parameters=True,
        cuda_device=device_ids[0] if cuda else -1,
        rank_restart_grace_ms=opts.get("rank_restart_grace_ms"),
        min_nodes=opts.get("min_nodes"),
        # The client library's name for it (client/include/gradd/client.h).
        divide_by_initial_world_size=bool(
            opts.get("divide_by_initial_world_after_reformation")),
        # Autotune: the daemon picks the cap (bucket_cap_mb="auto", or a
        # daemon configured with `bucket_cap_mb: auto`); gradd/_rebuild.py
        # follows its plan switches.
        bucket_cap_auto=bool(bucket_cap_auto),
        follow_plan_switches=True,
    )
    if client.world_size != world.world_size or client.global_rank != world.rank:
        got = (client.global_rank, client.world_size)
        client.detach()
        source = "the process group" if world.group is not None else "the environment"
        raise GraddError(
            f"job '{world.job_id}': the daemon placed this trainer at rank {got[0]} of "
            f"{got[1]}, but {source} says rank {world.rank} of {world.world_size}"
        )
    return client, bcast


def bucket_info(client, names: List[str]) -> List[dict]:
    """Per model bucket of `client`'s plan, in plan order: dtype, size_bytes
    and the `names` of its parameters (gradd's own used-map bucket, which
    holds no model parameter, is not listed)."""
    out = []
    for b in range(client.num_buckets):
        info = client.bucket(b)
        if not info["params"]:
            continue
        info["param_names"] = [names[i] for i in info["params"]]
        out.append(info)
    return out
