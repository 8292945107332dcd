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
buckets by ranks that ran out (gradd/_trainer_join.py). ``UnevenInputs``
hands such models over.

Differences from torch: a forward that does not sync gradients (``no_grad``,
``no_sync``) runs no join step and no buffer sync in join mode; gradd's
iterations are synced backward passes. Join mode ends when the context exits
(torch leaves ``_join_config`` enabled, which there is harmless).
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch
from torch.distributed.algorithms.join import Join, JoinHook

from gradd import _state_sync, _trainer_join
from gradd._C import AbortedError
from gradd._trainer_hooks import TrainerComm

__all__ = ["GraddJoin", "GraddJoinHook", "UnevenInputs", "non_member_group"]


def non_member_group():
    """The DDP's ``join_process_group`` (module doc)."""
    from torch.distributed.distributed_c10d import GroupMember

    return GroupMember.NON_GROUP_MEMBER


class GraddJoinHook(JoinHook):
    """The gradd DDP's join hook: no main hook (the daemon fills in for joined
    ranks); the post hook is `finish`, the DDP's end of join (it joins
    through the daemon and syncs the final model)."""

    def __init__(self, finish: Callable[[], None]):
        self._finish = finish

    def main_hook(self) -> None:  # never needed: no shadow collectives
        pass

    def post_hook(self, is_last_joiner: bool) -> None:
        self._finish()


class GraddJoin(Join):
    """``model.join()``: torch's Join protocol, carried out by the daemon."""

    def __exit__(self, type, value, traceback):
        if not self._enable or type:
            return  # propagate the exception, as torch's Join does
        for hook in self._join_hooks:
            hook.post_hook(True)


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


class UnevenInputs:
    """One attach's join for uneven inputs (module doc).

    What the DDP gives it: its `client`, `reducer` (whose ``comm`` says
    whether the hook runs in the trainer: then join is
    gradd/_trainer_join.py's), `module`, the job's `rank` and `world_size`,
    its `device`, the broadcast area's size (`broadcast_bytes`),
    `broadcast(tensors, root)` (the DDP's broadcast through the daemon),
    `who` for messages and `end_join_mode()`, which disables the DDP's
    ``_join_config`` (torch's attribute, which torch's Join sets on the
    DDP). The join settings come with each call: the DDP's
    ``_join_config`` and ``_divide_by_initial_world_size`` (torch's names).
    Runs on the trainer's main thread."""

    def __init__(self, client, reducer, module: torch.nn.Module, *, rank: int,
                 world_size: int, device: torch.device, broadcast_bytes: int,
                 broadcast: Callable[[List[torch.Tensor], int], None], who: str,
                 end_join_mode: Callable[[], None]):
        self._client = client
        self._reducer = reducer
        self._module = module
        self._rank = rank
        self._world_size = world_size
        self._device = device
        self._broadcast_bytes = broadcast_bytes
        self._broadcast = broadcast
        self._who = who
        self._end_join_mode = end_join_mode

    def _trainer_join(self) -> Optional[_trainer_join.TrainerJoin]:
        """The trainer-side protocol when the model's hook runs in the
        trainer, else None."""
        comm = self._reducer.comm
        if not isinstance(comm, TrainerComm):
            return None
        return _trainer_join.TrainerJoin(
            comm, self._module, rank=self._rank, world_size=self._world_size,
            device=self._device, broadcast=self._broadcast, who=self._who)

    def _ensure_entered(self, config, divide_by_initial_world_size: bool) -> None:
        client = self._client
        if not client.in_join:
            client.join_enter(
                divide_by_initial_world_size=divide_by_initial_world_size,
                throw_on_early_termination=bool(config.throw_on_early_termination),
            )

    def on_forward(self, config, *, divide_by_initial_world_size: bool,
                   sync_buffers: bool) -> None:
        """A forward that syncs gradients, in join mode: this rank takes
        part in the iteration, buffers (when `sync_buffers`: the DDP's
        ``require_forward_param_sync and broadcast_buffers``, world > 1)
        come from the highest active rank, and with
        throw_on_early_termination this raises once a rank ran out of
        inputs."""
        trainer = self._trainer_join()
        if trainer is not None:
            try:
                trainer.on_forward(config, sync_buffers)
            except RuntimeError:  # e.g. throw_on_early_termination: join mode ends
                self._end_join_mode()
                raise
            return
        self._ensure_entered(config, divide_by_initial_world_size)
        buffers: List[torch.Tensor] = []
        if sync_buffers:
            buffers = _state_sync.module_buffers(self._module)
        staging = _pack(buffers)
        if staging is not None and staging.numel() > self._broadcast_bytes:
            raise RuntimeError(
                f"gradd join ({self._who}): the module's buffers "
                f"({staging.numel()} bytes) exceed the broadcast area ({self._broadcast_bytes} "
                "bytes); raise broadcast_chunk_mb"
            )
        try:
            self._client.join_active(None if staging is None else staging.numpy())
        except AbortedError:
            self._end_join_mode()  # the daemon ended join mode on every rank
            raise
        if staging is not None:
            _unpack(staging, buffers)

    def finish(self, config, *, divide_by_initial_world_size: bool) -> int:
        """This rank ran out of inputs: wait for every rank (join mode ends
        here); returns the authoritative rank, whose model
        :meth:`sync_final_model` then copies."""
        trainer = self._trainer_join()
        if trainer is not None:
            try:
                return trainer.finish(config, bool(config.throw_on_early_termination))
            finally:
                self._end_join_mode()
        self._ensure_entered(config, divide_by_initial_world_size)
        try:
            return self._client.join()
        finally:
            self._end_join_mode()

    def sync_final_model(self, authoritative: int) -> None:
        """Every rank copies the authoritative rank's parameters and
        buffers (torch's ``_sync_final_model``)."""
        if self._world_size > 1:
            self._broadcast(_state_sync.module_states(self._module), authoritative)
