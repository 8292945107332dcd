"""Rank restart for gradd.torch.DistributedDataParallel.

With ``rank_restart_grace_ms > 0`` (the DDP's keyword, else
``$GRADD_RANK_RESTART_GRACE_MS``, else the daemon's setting) a trainer whose
process dies does not fail its job at once: the daemon keeps the job (plan,
memory) and makes the other ranks wait, up to the grace, for the process to
be started again with the same RANK / LOCAL_RANK and job id and the same
model. Then (common/control_block.h "Rank restart"):

* the iteration the survivors were in is aborted by every rank: their
  ``backward()`` raises ``gradd.IterationAbortedError`` (an ``AbortedError``,
  a ``RuntimeError``; torch's autograd engine passes it through unchanged
  from the end-of-backward callback), their gradients hold no average, and
  ``ddp.should_commit()`` is False until the next successful backward. The
  DDP's per-iteration state is reset here, so the caller skips the optimizer
  step and retries the same batch (zero_grad, forward, backward).
* before the next iteration (``sync_state``: at the start of every forward,
  before the buffer broadcast, the bucket rebuild and anything else
  collective, or earlier when the user calls ``ddp.sync_state()`` at the top
  of the loop) every rank takes part in the state sync: the root (the lowest
  rank that holds the job's state, ``client.begin_state_sync()``) broadcasts
  the parameters and buffers (in place, on every rank), then each
  ``register_state()``'d state: ``torch.save`` of its ``state_dict_fn()`` on
  the root, its length then its bytes through the daemon; the ranks that
  rejoined and were not synced yet ``torch.load`` it and call its
  ``load_state_dict_fn``, the others only take part.
* a restarted rank's constructor does not broadcast rank 0's module state
  (the survivors are not in that broadcast): it gets the job's state at its
  first sync instead.

Node loss and arrival (``min_nodes=``, else ``$GRADD_MIN_NODES``, else the
daemon's; control_block.h "Re-formation") reuses all of this: when a node of
a multi-node job dies, comes back or re-forms for a restarted rank, every
rank's iteration in progress is aborted the same way and the state sync
runs; a rank whose node was one iteration behind (``client.state_behind``)
loads the state like a rejoined rank. ``ddp.live_world_size`` and
``ddp.epoch`` say where the job stands; global ranks never change.

Bucket rebuild is off for jobs with a grace or min_nodes (a rebuild is a job-wide switch
a restarted rank could not know it missed); the buckets keep the first plan.

The job id must be explicit (``job_id=`` or ``$GRADD_JOB``): a restarted
process has to name the job it re-attaches to, and an id drawn at random
through the process group or torchrun's agent store would be a new one.
"""
from __future__ import annotations

import io
import os
import warnings
from typing import Callable, List, Optional, Tuple

import torch

from gradd import _state_sync
from gradd._C import GraddError, IterationAbortedError

GRACE_ENV = "GRADD_RANK_RESTART_GRACE_MS"
MIN_NODES_ENV = "GRADD_MIN_NODES"
JOB_ENV = "GRADD_JOB"


def _requested_uint32(value, keyword: str, env: str, unit: str) -> Optional[int]:
    """`value` (the keyword) when given, else $`env` parsed as an integer; None
    when neither is set. Checked to be an int in [0, 2^32)."""
    if value is not None:
        source = f"{keyword}="
    else:
        raw = os.environ.get(env, "")
        if raw == "":
            return None
        source = f"${env}"
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{source}={raw!r} is not an integer ({unit})") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{source} must be an int ({unit}), got {type(value).__name__}")
    if not 0 <= value < 1 << 32:
        raise ValueError(f"{source} must be in [0, 2^32) {unit}, got {value}")
    return value


def requested_grace(rank_restart_grace_ms: Optional[int]) -> Optional[int]:
    """The grace this rank asks for: the keyword, else $GRADD_RANK_RESTART_GRACE_MS
    (None: neither; the daemon's setting applies)."""
    return _requested_uint32(rank_restart_grace_ms, "rank_restart_grace_ms", GRACE_ENV, "milliseconds")


def requested_min_nodes(min_nodes: Optional[int]) -> Optional[int]:
    """The min_nodes this rank asks for: the keyword, else $GRADD_MIN_NODES
    (None: neither; the daemon's min_nodes applies)."""
    return _requested_uint32(min_nodes, "min_nodes", MIN_NODES_ENV, "nodes")


def check_job_id(
    grace: Optional[int], job_id: Optional[str], process_group, what: str = "rank_restart_grace_ms"
) -> None:
    """With a grace > 0 (or min_nodes > 0: `what`) the job id must be
    explicit (see the module doc)."""
    if not grace:
        return
    if not (job_id or os.environ.get(JOB_ENV)):
        raise ValueError(
            f"{what}={grace} needs an explicit job id (job_id= or "
            f"${JOB_ENV}): a restarted trainer re-attaches to its running job by id, "
            "and an id drawn through the process group, torchrun's agent store or "
            "MASTER_ADDR/MASTER_PORT would not name the same job in the new process"
        )
    if process_group is not None or _default_group_initialised():
        warnings.warn(
            "gradd rank restart with a torch process group: a restarted process "
            "cannot rejoin the process group (its rendezvous needs every rank), so it "
            "can re-attach to the gradd job only if it builds the DDP without one "
            "(from RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE and the job id)",
            stacklevel=3,
        )


def _default_group_initialised() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


class RestartState:
    """One DDP's rank restart state (``ddp._restart``)."""

    def __init__(self, client, explicit_job_id: bool):
        # (getattr: stand-in clients of tests need not know rank restart)
        self.grace_ms = int(getattr(client, "rank_restart_grace_ms", 0))
        # Node loss and arrival: the job's min_nodes (0: not elastic); its
        # re-formations abort and sync exactly like a rank restart.
        self.min_nodes = int(getattr(client, "min_nodes", 0))
        self.rejoined = bool(getattr(client, "rejoined", False))
        # The iteration this rank rejoined at (its first), else None.
        self.rejoin_iteration: Optional[int] = int(client.iteration) if self.rejoined else None
        # A rejoined rank loads the registered states at its first sync.
        self.unsynced = self.rejoined
        self.last_aborted = False
        # The client iteration of the last completed state sync.
        self.synced_iteration: Optional[int] = None
        self.states: List[Tuple[Callable[[], object], Callable[[object], object]]] = []
        if self.grace_ms > 0 and not explicit_job_id:
            warnings.warn(
                f"the job runs with rank_restart_grace_ms={self.grace_ms} (the daemon's "
                "setting) but its id was drawn, not named (job_id= / $GRADD_JOB): a "
                "restarted trainer could not find its job again",
                stacklevel=4,
            )


def register_state(ddp, state_dict_fn, load_state_dict_fn) -> None:
    if not callable(state_dict_fn) or not callable(load_state_dict_fn):
        raise TypeError(
            "register_state(state_dict_fn, load_state_dict_fn) takes two callables, e.g. "
            "optimizer.state_dict and optimizer.load_state_dict"
        )
    ddp._restart.states.append((state_dict_fn, load_state_dict_fn))


def on_aborted(ddp, error: BaseException) -> None:
    """The iteration (or collective round) was aborted by a rank restart:
    nothing is recorded as a failure; the reducer's per-iteration state is
    reset so that the batch can be retried. Raises `error`."""
    reducer = ddp.__dict__.get("_reducer")
    if reducer is not None:
        reducer.abort_iteration()
    restart = ddp.__dict__.get("_restart")
    if restart is not None:
        restart.last_aborted = True
    raise error


def on_backward_done(ddp) -> None:
    restart = ddp.__dict__.get("_restart")
    if restart is not None:
        restart.last_aborted = False


def sync_state(ddp) -> bool:
    """Runs the state sync if one is due (see the module doc); returns
    whether it ran. Collective when due: every rank of the job reaches it at
    the same point of its iteration sequence."""
    client = ddp._client
    restart = ddp.__dict__.get("_restart")
    if (
        client is None
        or restart is None
        or (restart.grace_ms == 0 and restart.min_nodes == 0)
        or ddp.world_size < 2
    ):
        return False
    ran = False
    # At most one completed sync per iteration: the client library keeps
    # reporting a sync pending on a rejoined rank until its first bucket
    # after the sync (so that it keeps offering no state if the sync's
    # broadcasts are cut short), and a second call in the same iteration
    # (sync_state() at the top of the loop, then forward) must not start a
    # sync the others do not run. A restart after the sync aborts the
    # iteration, and the next one syncs again.
    while restart.synced_iteration != client.iteration and client.state_sync_pending():
        try:
            _sync_once(ddp, client, restart)
        except IterationAbortedError:
            # Another restart aborted the sync's round: it is due again
            # (sync_seq moved on); a partly loaded state is loaded again.
            continue
        restart.synced_iteration = client.iteration
        ran = True
    return ran


def _sync_once(ddp, client, restart: RestartState) -> None:
    # A rank whose node the last re-formation found one iteration behind
    # offers no state (the client library decides, as for a rejoined
    # rank) and loads what the root sends (read before the sync: the
    # client clears it only after its next gradient).
    behind = bool(getattr(client, "state_behind", False))
    try:
        root = int(client.begin_state_sync())
    except IterationAbortedError:
        raise
    except GraddError as e:
        ddp._fail(e)
    load = (restart.unsynced or behind) and ddp.rank != root

    def on_error(e):
        if isinstance(e, IterationAbortedError):
            raise e
        ddp._fail(e)

    chunk = ddp._bcast_bytes
    _state_sync.broadcast_tensors(
        client, _state_sync.module_states(ddp.module), chunk, on_error, root=root
    )
    for state_dict_fn, load_state_dict_fn in restart.states:
        blob = None
        if ddp.rank == root:
            out = io.BytesIO()
            torch.save(state_dict_fn(), out)
            blob = out.getvalue()
        length = torch.tensor([len(blob) if blob is not None else 0], dtype=torch.int64)
        _state_sync.broadcast_tensors(client, [length], chunk, on_error, root=root)
        n = int(length.item())
        buf = torch.empty(n, dtype=torch.uint8)
        if blob is not None:
            buf.copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
        _state_sync.broadcast_tensors(client, [buf], chunk, on_error, root=root)
        if load:
            # The job's own state_dict_fn() output, any picklable object:
            # weights_only=False (torch 2.6's torch.load defaults to True and
            # refuses non-tensor objects; 1.13 has the argument, False).
            load_state_dict_fn(
                torch.load(io.BytesIO(buf.numpy().tobytes()), weights_only=False))
    restart.unsynced = False
