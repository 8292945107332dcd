"""join() for uneven inputs when the model's communication hook runs in the
trainer (gradd/_trainer_hooks.py). gradd/_join.py hands over to this
module for such models; it runs on the trainer's main thread.

With a trainer-side hook the daemon takes no part in backward, so it cannot
fill in for a rank that ran out of inputs (gradd/_join.py's way). The
trainers do what torch 1.13 does with a comm hook (``_DDPJoinHook``): a rank
that ran out keeps issuing the collectives the active ranks issue, with
zeros, until every rank has joined.

* Join step, once per synced forward of an active rank and once per round
  of a joined one: an allreduce (SUM, int32) over the DDP's ranks (the
  job's gradd group, else the DDP's torch.distributed group; see
  ``TrainerComm.group``) of ``[terminate, sync_buffers, active_0 ..
  active_{W-1}]``, indexed by the job's rank. It does in one collective
  what torch does in up to three (``Join.notify_join_context``'s ones, its
  ``throw_on_early_termination`` check, ``_find_common_rank`` for the
  buffer sync): every rank learns who is still active, whether buffers are
  synced this iteration (the active ranks' ``require_forward_param_sync``
  and ``broadcast_buffers``, which a joined rank cannot know by itself) and
  whether a joined rank asked to terminate.
* Buffers, when synced: from the highest active rank (torch's rule in join
  mode), through the daemon's broadcast, on active and joined ranks alike.
* Backward: active ranks run the hook as usual; a joined rank runs it on
  zero buckets of the same layout (``TrainerComm.shadow_iteration``), so
  the hook's collectives (over whatever group its state names) match, and
  matches the used-map reduce when the active ranks' runs. As with torch's
  DDP, the hook divides (``divide_by_initial_world_size`` is not used: an
  averaging hook divides by its group's size, i.e. the initial world).
* When a join step shows no active rank, the ranks that saw that at their
  first step are the last joiners; one more allreduce names the highest of
  them, whose parameters and buffers every rank then copies (torch's
  ``_sync_final_model``), through the daemon's broadcast.
* ``throw_on_early_termination``: a joined rank's step carries
  ``terminate``; the active ranks raise torch's "Detected at least one rank
  that exhausted inputs. Throwing across all ranks." in that forward, the
  joined rank "Rank <r> exhausted all inputs.".

As with gradd's daemon join, a forward that does not sync gradients
(``no_grad``, ``no_sync``) runs no join step. A model with a trainer-side
hook must be the only joinable of its join context (``model.join()`` or
``Join([model])``); a second joinable before it is refused.
"""
from __future__ import annotations

from typing import Callable, List, Tuple

import torch

from gradd import _state_sync
from gradd._trainer_hooks import TrainerComm

__all__ = ["TrainerJoin"]


class TrainerJoin:
    """The trainer-side join protocol of one model (module doc). Given the
    model's TrainerComm (`comm`: its group and ``shadow_iteration``), the
    `module`, the job's `rank` and `world_size`, the model's `device`,
    `broadcast(tensors, root)` (the DDP's broadcast through the daemon) and
    `who` for messages; the join settings (torch's ``_JoinConfig``) come
    with each call."""

    def __init__(self, comm: TrainerComm, module: torch.nn.Module, *, rank: int,
                 world_size: int, device: torch.device,
                 broadcast: Callable[[List[torch.Tensor], int], None], who: str):
        self._comm = comm
        self._module = module
        self._rank = rank
        self._world_size = world_size
        self._device = device
        self._broadcast = broadcast
        self._who = who

    def _check_alone(self, config) -> None:
        if not config.is_first_joinable:
            raise NotImplementedError(
                f"gradd ({self._who}): a model whose communication hook "
                f"{self._comm.name} runs in the trainer must be the only joinable of "
                "its join context (model.join() or Join([model]))"
            )

    def _group(self):
        comm = self._comm
        group = comm.group()
        if group is None:
            raise RuntimeError(
                f"gradd ({self._who}): join() with the communication hook {comm.name}, which "
                "runs in the trainer, keeps the ranks in step with collectives over the DDP's "
                f"ranks: the job's gradd group is not usable ({comm.unusable}) and no "
                "torch.distributed process group is initialized; call "
                "torch.distributed.init_process_group first"
            )
        return group

    def _allreduce_ranks(self, head: List[int], mine: bool) -> Tuple[List[int], List[int]]:
        """SUM over the DDP's ranks of ``head + [one-hot of this rank if
        mine]``: (the summed head, the ranks that set their slot)."""
        import torch.distributed as dist

        group = self._group()
        msg = torch.zeros(len(head) + self._world_size, dtype=torch.int32)
        msg[: len(head)] = torch.tensor(head, dtype=torch.int32)
        if mine:
            msg[len(head) + self._rank] = 1
        if self._device.type == "cuda" and dist.get_backend(group) not in ("gloo", "gradd"):
            msg = msg.to(self._device)  # e.g. NCCL
        dist.all_reduce(msg, group=group)
        values = msg.cpu().tolist()
        return values[: len(head)], [r for r, v in enumerate(values[len(head):]) if v > 0]

    def _step(self, active: bool, sync_buffers: bool, terminate: bool):
        """The join step (module doc): (active ranks, sync buffers, terminate)."""
        (term, sync), ranks = self._allreduce_ranks([int(terminate), int(sync_buffers)], active)
        return ranks, sync > 0, term > 0

    def _sync_buffers(self, root: int) -> None:
        buffers = _state_sync.module_buffers(self._module)
        if buffers:
            self._broadcast(buffers, root)

    def on_forward(self, config, sync_buffers: bool) -> None:
        """A forward of an active rank in join mode that syncs gradients;
        `sync_buffers`: the DDP's ``require_forward_param_sync and
        broadcast_buffers``, world > 1."""
        self._check_alone(config)
        sync = bool(sync_buffers and _state_sync.module_buffers(self._module))
        active, sync, terminate = self._step(True, sync, False)
        if terminate:
            raise RuntimeError(
                "Detected at least one rank that exhausted inputs. Throwing across all ranks. "
                f"(gradd {self._who})"
            )
        if sync:
            self._sync_buffers(max(active))

    def finish(self, config, throw_on_early_termination: bool) -> int:
        """This rank ran out of inputs: shadow the active ranks' iterations
        until every rank has joined; returns the authoritative rank (whose
        model every rank then copies)."""
        self._check_alone(config)
        comm = self._comm
        last_joiner = True
        while True:
            active, sync, _ = self._step(False, False, throw_on_early_termination)
            if not active:
                break
            if throw_on_early_termination:
                raise RuntimeError(f"Rank {self._rank} exhausted all inputs.")
            last_joiner = False
            if sync:
                self._sync_buffers(max(active))
            comm.shadow_iteration()
        _, last_joiners = self._allreduce_ranks([], last_joiner)
        return max(last_joiners)
