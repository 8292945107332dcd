"""join() for uneven inputs: gradd.torch.DistributedDataParallel's side.

torch's DDP keeps every rank in step by having a rank that ran out of inputs
*shadow* the others' collectives (its join hook re-runs the allreduces with
zeros every iteration). With gradd nothing of that runs in the trainer: a rank
that ran out tells the daemon "joined from iteration i" (``Client.join``) and
blocks; the daemon contributes zeros for it, divides by the initial world size
or by the ranks still active, keeps the other nodes' collectives matched, and
when every rank has joined names the authoritative rank (torch: the highest
rank among the last to join), whose parameters and buffers every rank then
copies, as torch's ``_sync_final_model`` does. Active ranks say so in each
synced forward (``Client.join_active``), which also carries the buffer sync
(``broadcast_buffers``: from the highest active rank, as torch does in join
mode) and, with ``throw_on_early_termination``, raises on every rank once one
ran out of inputs.

Two ways in, both without ``torch.distributed.init_process_group``:

* ``model.join(...)`` returns :class:`GraddJoin`, a
  ``torch.distributed.algorithms.join.Join`` whose ``__exit__`` runs the gradd
  protocol directly.
* ``torch.distributed.algorithms.join.Join([model])``: the model is a
  ``Joinable`` whose ``join_process_group`` is torch's "not a member" group
  (``GroupMember.NON_GROUP_MEMBER``). Torch's context manager then skips its
  own collectives (it needs a default process group for those; torch 1.13
  warns once "Running all_reduce on global rank -1 which does not belong to
  the given group", which is expected here) and calls the gradd join hook's
  ``post_hook`` once at exit, which does the real join through the daemon.
  Only gradd joinables can share such a context (torch's own ZeroRedundancy
  optimizer needs a torch process group).

A model whose communication hook runs in the trainer (gradd/_trainer_hooks.py)
keeps the daemon out of backward, so the daemon cannot fill in for it: its
join follows torch's own protocol in the trainers, with the hook run on zero
buckets by ranks that ran out (gradd/_trainer_join.py). ``on_forward`` and
``finish`` hand such models over.

Differences from torch: a forward that does not sync gradients (``no_grad``,
``no_sync``) runs no join step and no buffer sync in join mode; gradd's
iterations are synced backward passes. Join mode ends when the context exits
(torch leaves ``_join_config`` enabled, which there is harmless).
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch.distributed.algorithms.join import Join, JoinHook, _JoinConfig

from gradd import _state_sync, _trainer_join
from gradd._C import AbortedError

__all__ = ["GraddJoin", "GraddJoinHook"]


def _non_member_group():
    from torch.distributed.distributed_c10d import GroupMember

    return GroupMember.NON_GROUP_MEMBER


class GraddJoinHook(JoinHook):
    """The gradd DDP's join hook: no main hook (the daemon fills in for joined
    ranks), the post hook joins through the daemon and syncs the final
    model."""

    def __init__(self, ddp, divide_by_initial_world_size: bool):
        self.ddp = ddp
        ddp._divide_by_initial_world_size = bool(divide_by_initial_world_size)

    def main_hook(self) -> None:  # never needed: no shadow collectives
        pass

    def post_hook(self, is_last_joiner: bool) -> None:
        finish(self.ddp)


class GraddJoin(Join):
    """``model.join()``: torch's Join protocol, carried out by the daemon."""

    def __exit__(self, type, value, traceback):
        if not self._enable or type:
            return  # propagate the exception, as torch's Join does
        for hook in self._join_hooks:
            hook.post_hook(True)


def join_process_group(ddp):
    return _non_member_group()


def _disable(ddp) -> None:
    ddp._join_config = _JoinConfig.construct_disabled_join_config()


def _throws(ddp) -> bool:
    return bool(ddp._join_config.throw_on_early_termination)


def _ensure_entered(ddp) -> None:
    client = ddp._client
    if not client.in_join:
        client.join_enter(
            divide_by_initial_world_size=getattr(ddp, "_divide_by_initial_world_size", True),
            throw_on_early_termination=_throws(ddp),
        )


def _pack(tensors: List[torch.Tensor]) -> Optional[torch.Tensor]:
    tensors = [t for t in tensors if t.numel() > 0]
    if not tensors:
        return None
    flat = [t.detach().reshape(-1).contiguous().view(torch.uint8) for t in tensors]
    # Host bytes: the broadcast area is shared memory (CUDA buffers too).
    return torch.cat(flat).cpu()


def _unpack(staging: torch.Tensor, tensors: List[torch.Tensor]) -> None:
    off = 0
    with torch.no_grad():
        for t in tensors:
            if t.numel() == 0:
                continue
            n = t.numel() * t.element_size()
            src = staging[off : off + n].clone().view(t.dtype).view(t.shape)
            t.copy_(src)
            off += n


def on_forward(ddp, grad_sync: bool) -> None:
    """A forward in join mode: this rank takes part in the iteration (only a
    forward that syncs gradients counts), buffers come from the highest
    active rank, and with throw_on_early_termination this raises once a rank
    ran out of inputs."""
    if not grad_sync:
        return
    if _trainer_join.applies(ddp):
        try:
            _trainer_join.on_forward(ddp, grad_sync)
        except RuntimeError:  # e.g. throw_on_early_termination: join mode ends
            _disable(ddp)
            raise
        return
    _ensure_entered(ddp)
    buffers: List[torch.Tensor] = []
    if ddp.require_forward_param_sync and ddp.broadcast_buffers and ddp.world_size > 1:
        buffers = _state_sync.module_buffers(ddp.module)
    staging = _pack(buffers)
    if staging is not None and staging.numel() > ddp._bcast_bytes:
        raise RuntimeError(
            f"gradd join (job '{ddp.job_id}', rank {ddp.rank}): the module's buffers "
            f"({staging.numel()} bytes) exceed the broadcast area ({ddp._bcast_bytes} "
            "bytes); raise broadcast_chunk_mb"
        )
    try:
        ddp._client.join_active(None if staging is None else staging.numpy())
    except AbortedError:
        _disable(ddp)  # the daemon ended join mode on every rank
        raise
    if staging is not None:
        _unpack(staging, buffers)


def finish(ddp) -> None:
    """This rank ran out of inputs: wait for every rank, then copy the
    authoritative rank's parameters and buffers."""
    if _trainer_join.applies(ddp):
        try:
            _trainer_join.finish(ddp, _throws(ddp))
        finally:
            _disable(ddp)
        return
    _ensure_entered(ddp)
    try:
        authoritative = ddp._client.join()
    finally:
        _disable(ddp)
    ddp._authoritative_rank = authoritative
    if ddp.world_size > 1:
        _broadcast(ddp, _state_sync.module_states(ddp.module), authoritative)


def _broadcast(ddp, tensors: List[torch.Tensor], root: int) -> None:
    """Overwrites `tensors` with global rank `root`'s, in rounds of at most
    the attach's broadcast area."""
    ddp._broadcast_tensors(tensors, root)
