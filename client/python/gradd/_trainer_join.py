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

from typing import List, Tuple

import torch

from gradd import _state_sync
from gradd._trainer_hooks import TrainerComm

__all__ = ["applies", "on_forward", "finish"]


def applies(ddp) -> bool:
    """Whether `ddp`'s hook runs in the trainer (then join is this module's)."""
    reducer = ddp._reducer
    return reducer is not None and isinstance(reducer.comm, TrainerComm)


def _who(ddp) -> str:
    return f"job '{ddp.job_id}', rank {ddp.rank}"


def _check_alone(ddp) -> None:
    if not ddp._join_config.is_first_joinable:
        raise NotImplementedError(
            f"gradd ({_who(ddp)}): a model whose communication hook "
            f"{ddp._reducer.comm.name} runs in the trainer must be the only joinable of "
            "its join context (model.join() or Join([model]))"
        )


def _group(ddp):
    comm = ddp._reducer.comm
    group = comm.group()
    if group is None:
        raise RuntimeError(
            f"gradd ({_who(ddp)}): join() with the communication hook {comm.name}, which "
            "runs in the trainer, keeps the ranks in step with collectives over the DDP's "
            f"ranks: the job's gradd group is not usable ({comm.unusable}) and no "
            "torch.distributed process group is initialized; call "
            "torch.distributed.init_process_group first"
        )
    return group


def _allreduce_ranks(ddp, head: List[int], mine: bool) -> Tuple[List[int], List[int]]:
    """SUM over the DDP's ranks of ``head + [one-hot of this rank if mine]``:
    (the summed head, the ranks that set their slot)."""
    import torch.distributed as dist

    group = _group(ddp)
    msg = torch.zeros(len(head) + ddp.world_size, dtype=torch.int32)
    msg[: len(head)] = torch.tensor(head, dtype=torch.int32)
    if mine:
        msg[len(head) + ddp.rank] = 1
    if ddp._device.type == "cuda" and dist.get_backend(group) not in ("gloo", "gradd"):
        msg = msg.to(ddp._device)  # e.g. NCCL
    dist.all_reduce(msg, group=group)
    values = msg.cpu().tolist()
    return values[: len(head)], [r for r, v in enumerate(values[len(head):]) if v > 0]


def _step(ddp, active: bool, sync_buffers: bool, terminate: bool):
    """The join step (module doc): (active ranks, sync buffers, terminate)."""
    (term, sync), ranks = _allreduce_ranks(ddp, [int(terminate), int(sync_buffers)], active)
    return ranks, sync > 0, term > 0


def _sync_buffers(ddp, root: int) -> None:
    buffers = _state_sync.module_buffers(ddp.module)
    if buffers:
        ddp._broadcast_tensors(buffers, root)


def on_forward(ddp, grad_sync: bool) -> None:
    """A forward of an active rank in join mode (only one that syncs
    gradients counts)."""
    if not grad_sync:
        return
    _check_alone(ddp)
    sync = bool(ddp.require_forward_param_sync and ddp.broadcast_buffers and ddp.world_size > 1
                and _state_sync.module_buffers(ddp.module))
    active, sync, terminate = _step(ddp, True, sync, False)
    if terminate:
        raise RuntimeError(
            "Detected at least one rank that exhausted inputs. Throwing across all ranks. "
            f"(gradd {_who(ddp)})"
        )
    if sync:
        _sync_buffers(ddp, max(active))


def finish(ddp, throw_on_early_termination: bool) -> None:
    """This rank ran out of inputs: shadow the active ranks' iterations
    until every rank has joined, then copy the authoritative model."""
    _check_alone(ddp)
    comm = ddp._reducer.comm
    last_joiner = True
    while True:
        active, sync, _ = _step(ddp, False, False, throw_on_early_termination)
        if not active:
            break
        if throw_on_early_termination:
            raise RuntimeError(f"Rank {ddp.rank} exhausted all inputs.")
        last_joiner = False
        if sync:
            _sync_buffers(ddp, max(active))
        comm.shadow_iteration()
    _, last_joiners = _allreduce_ranks(ddp, [], last_joiner)
    authoritative = max(last_joiners)
    ddp._authoritative_rank = authoritative
    if ddp.world_size > 1:
        ddp._broadcast_tensors(_state_sync.module_states(ddp.module), authoritative)
