"""torch.distributed backend "gradd": collectives run by the node's gradd daemon.

::

    import gradd.distributed  # (gradd.torch imports it too)
    import torch.distributed as dist
    dist.init_process_group("gradd")           # env:// as usual (torchrun)
    dist.all_reduce(loss)                      # e.g. for logging
    model = torch.nn.parallel.DistributedDataParallel(model)  # torch's own

Each process group is one gradd job of its ranks: the group's rank 0 draws a
fresh job id and shares it through the group's store (torch hands every group
its own prefixed store, so ``dist.new_group(ranks, backend="gradd")`` gets a
job of its own). The ranks on one node (same host name and same gradd
socket) are that job's local ranks on that node's daemon; the daemons reduce
locally and then between nodes (Gloo), as they do gradient buckets.

Supported: CPU tensors of float32/64, float16, bfloat16, int32/64, uint8,
int8; all_reduce (SUM, AVG, MIN, MAX), all_reduce_coalesced, broadcast,
all_gather (+ all_gather_into_tensor / _all_gather_base,
all_gather_coalesced), reduce_scatter (+ reduce_scatter_tensor /
_reduce_scatter_base), reduce, gather, scatter, barrier; on torch 2.x also
the coalesced forms torch's ``_coalescing_manager`` issues
(allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced). Not
supported (RuntimeError naming the operation): point-to-point send/recv
(so batch_isend_irecv), all_to_all, other reduce ops, CUDA tensors.

torch 1.13 and 2.x (the ProcessGroup / Backend split: there the backend
serves the device "cpu" of torch's own ProcessGroup); the differences are in
gradd/_c10d_compat.py and c10d/torch_compat.h. An extension built for
another torch refuses to import (``available()`` is False, the reason in
``unavailable_reason()``) instead of crashing.

Environment: GRADD_SOCKET (this node's daemon), GRADD_COORDINATOR (else
MASTER_ADDR) for multi-node jobs, LOCAL_RANK / LOCAL_WORLD_SIZE for the
default group when set (else derived from the host names),
GRADD_COLLECTIVE_BYTES (the per-rank collective area, default 4 MiB).
"""
from __future__ import annotations

import datetime
import os
import socket as _socket
import uuid

# First: an unsupported torch fails here, naming its version, before any
# other torch API is used or gradd._c10d (built against torch) is loaded.
from gradd import _torch_compat  # noqa: F401  isort: skip
import torch.distributed as dist

from gradd import _c10d_compat, _world

try:
    from gradd import _c10d
except ImportError as e:  # built without libtorch-dev
    _c10d = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None

BACKEND = "gradd"

__all__ = ["BACKEND", "available", "register", "unavailable_reason"]


def available() -> bool:
    """Whether the backend's extension (gradd._c10d) was built for this torch."""
    return _c10d is not None


def unavailable_reason() -> str | None:
    """Why gradd._c10d cannot be used (None when it can)."""
    return None if _c10d is not None else str(_IMPORT_ERROR)


def _node_key() -> str:
    # The same node identity as gradd.torch (gradd/_world.py): host name and
    # the resolved socket the client library will use.
    return f"{_socket.gethostname()}\n{_world.socket_path(None)}"


def _env_int(name):
    value = os.environ.get(name, "")
    return int(value) if value.strip() else None


def _layout(store, rank, size):
    """(local_rank, local_world_size, node_rank, num_nodes) of `rank`."""
    if not dist.is_initialized():
        # The default group: the launcher's LOCAL_RANK / LOCAL_WORLD_SIZE win.
        local_rank, local_size = _env_int("LOCAL_RANK"), _env_int("LOCAL_WORLD_SIZE")
        if local_rank is not None and local_size and size % local_size == 0:
            node_rank = rank // local_size
            if node_rank * local_size + local_rank != rank:
                raise RuntimeError(
                    f"gradd backend: RANK {rank} is not node {node_rank} x "
                    f"LOCAL_WORLD_SIZE {local_size} + LOCAL_RANK {local_rank}; "
                    "gradd places ranks node by node")
            return local_rank, local_size, node_rank, size // local_size
    store.set(f"gradd/node/{rank}", _node_key())
    keys = [store.get(f"gradd/node/{r}").decode() for r in range(size)]
    nodes = []  # node keys in the order of their first rank
    for k in keys:
        if k not in nodes:
            nodes.append(k)
    members = {k: [r for r in range(size) if keys[r] == k] for k in nodes}
    local_size = len(members[nodes[0]])
    for node_rank, k in enumerate(nodes):
        expected = list(range(node_rank * local_size, (node_rank + 1) * local_size))
        if members[k] != expected:
            layout = "; ".join(f"{k.replace(chr(10), ' ')}: ranks {members[k]}" for k in nodes)
            raise RuntimeError(
                "gradd backend: the group's ranks must be placed node by node, "
                f"the same number on every node; got {layout}")
    me = keys[rank]
    return members[me].index(rank), local_size, nodes.index(me), len(nodes)


def _create(*args):
    """torch.distributed's creator for the backend "gradd" (see module doc):
    (store, rank, size, timeout); on torch 2.x it returns the c10d Backend
    that torch's own ProcessGroup wraps."""
    store, rank, size, timeout = _c10d_compat.creator_args(args)
    if _c10d is None:
        hint = ("; install libtorch-dev and rebuild"
                if isinstance(_IMPORT_ERROR, ModuleNotFoundError) else "")
        raise RuntimeError(f"gradd backend unavailable: {_IMPORT_ERROR}{hint}")
    if rank == 0:
        store.set("gradd/job", f"torch-{uuid.uuid4().hex}")
    job_id = store.get("gradd/job").decode()
    local_rank, local_size, node_rank, num_nodes = _layout(store, rank, size)
    coordinator = os.environ.get("GRADD_COORDINATOR") or os.environ.get("MASTER_ADDR", "")
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return _c10d.create(
        rank,
        size,
        job_id=job_id,
        socket=os.environ.get("GRADD_SOCKET", ""),
        local_rank=local_rank,
        local_world_size=local_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        coordinator=coordinator if num_nodes > 1 else "",
        timeout=float(timeout or 0),
        collective_bytes=_env_int("GRADD_COLLECTIVE_BYTES") or 0,
    )


def register() -> None:
    """Registers the backend "gradd" with torch.distributed (idempotent)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    _c10d_compat.register(BACKEND, _create)


register()
