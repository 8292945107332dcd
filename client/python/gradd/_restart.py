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
  restarted and were not synced yet ``torch.load`` it and call its
  ``load_state_dict_fn``, the others only take part.
* a restarted rank's constructor does not broadcast rank 0's module state
  (the survivors are not in that broadcast): it gets the job's state at its
  first sync instead.

Node loss and arrival (``min_nodes=``, else ``$GRADD_MIN_NODES``, else the
daemon's; control_block.h "Re-formation") reuses all of this: when a node of
a multi-node job dies, comes back or re-forms for a restarted rank, every
rank's iteration in progress is aborted the same way and the state sync
runs; a rank whose node was one iteration behind (``client.state_behind``)
loads the state like a restarted rank. ``ddp.live_world_size`` and
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


def check_settings(rank_restart_grace_ms: Optional[int], min_nodes: Optional[int],
                   job_id: Optional[str], process_group) -> None:
    """The DDP constructor's checks of its rank restart and node loss
    keywords (or their environment variables): valid values, and an
    explicit job id when either is > 0."""
    grace = requested_grace(rank_restart_grace_ms)
    check_job_id(grace, job_id, process_group, stacklevel=5)
    # Node loss and arrival: min_nodes > 0 likewise (a trainer of a
    # returning node names the job it re-attaches to).
    wanted_min_nodes = requested_min_nodes(min_nodes)
    check_job_id(wanted_min_nodes, job_id, process_group, what="min_nodes", stacklevel=5)


def check_job_id(
    grace: Optional[int], job_id: Optional[str], process_group,
    what: str = "rank_restart_grace_ms", stacklevel: int = 3,
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
            "cannot become a member of the process group again (its rendezvous needs every rank), so it "
            "can re-attach to the gradd job only if it builds the DDP without one "
            "(from RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE and the job id)",
            stacklevel=stacklevel,
        )


def _default_group_initialised() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


class RankRestart:
    """One DDP's rank restart state and its state sync (see the module doc).

    The DDP builds one at every attach, with what the sync needs: its
    module (parameters and buffers travel), the job's rank and world size,
    the broadcast area's size and the DDP's ``fail`` (records a failure and
    raises); the client's answers at attach (grace, min_nodes, restarted)
    are read once, and each sync is given the DDP's client. It owns the
    registered states, whether this rank restarted (re-attached to its
    running job), whether the last iteration was aborted and which
    iteration was synced last. Runs on the trainer's
    main thread (forward, ``sync_state()``) and, for ``on_aborted`` /
    ``on_backward_done``, on the thread that runs autograd."""

    def __init__(
        self,
        client,
        *,
        explicit_job_id: bool,
        module: torch.nn.Module,
        rank: int,
        world_size: int,
        broadcast_bytes: int,
        fail: Callable[[BaseException], None],
    ):
        self._module = module
        self._rank = rank
        self._world_size = world_size
        self._broadcast_bytes = broadcast_bytes
        self._fail = fail
        # (getattr: stand-in clients of tests need not know rank restart)
        self.grace_ms = int(getattr(client, "rank_restart_grace_ms", 0))
        # Node loss and arrival: the job's min_nodes (0: a lost node fails
        # the job); its re-formations abort and sync exactly like a rank
        # restart.
        self.min_nodes = int(getattr(client, "min_nodes", 0))
        # This process attached to its job while the job was running (a
        # restarted rank, or a trainer of a node admitted at a re-formation).
        self.restarted = bool(getattr(client, "restarted", False))
        # The iteration this rank restarted at (its first), else None.
        self.restart_iteration: Optional[int] = (
            int(client.iteration) if self.restarted else None)
        # A restarted rank loads the registered states at its first sync.
        self.unsynced = self.restarted
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

    @property
    def enabled(self) -> bool:
        """Whether the job survives a rank restart or a node loss (a grace
        or min_nodes > 0): then bucket rebuild stays off and states sync."""
        return self.grace_ms > 0 or self.min_nodes > 0

    def register_state(self, state_dict_fn, load_state_dict_fn) -> None:
        if not callable(state_dict_fn) or not callable(load_state_dict_fn):
            raise TypeError(
                "register_state(state_dict_fn, load_state_dict_fn) takes two callables, e.g. "
                "optimizer.state_dict and optimizer.load_state_dict"
            )
        self.states.append((state_dict_fn, load_state_dict_fn))

    def on_aborted(self) -> None:
        """The iteration (or collective round) was aborted by a rank restart
        or a re-formation: not a failure; ``should_commit()`` is False until
        the next successful backward."""
        self.last_aborted = True

    def on_backward_done(self) -> None:
        self.last_aborted = False

    def sync_state(self, client) -> bool:
        """Runs the state sync over `client` (the DDP's) if one is due (see
        the module doc); returns whether it ran. Collective when due: every
        rank of the job reaches it at the same point of its iteration
        sequence."""
        if not self.enabled or self._world_size < 2:
            return False
        ran = False
        # At most one completed sync per iteration: the client library keeps
        # reporting a sync pending on a restarted rank until its first
        # bucket after the sync (so that it keeps offering no state if the
        # sync's broadcasts are cut short), and a second call in the same
        # iteration (sync_state() at the top of the loop, then forward) must
        # not start a sync the others do not run. A restart after the sync
        # aborts the iteration, and the next one syncs again.
        while self.synced_iteration != client.iteration and client.state_sync_pending():
            try:
                self._sync_once(client)
            except IterationAbortedError:
                # Another restart aborted the sync's round: it is due again
                # (sync_seq moved on); a partly loaded state is loaded again.
                continue
            self.synced_iteration = client.iteration
            ran = True
        return ran

    def _sync_once(self, client) -> None:
        # A rank whose node the last re-formation found one iteration behind
        # offers no state (the client library decides, as for a restarted
        # rank) and loads what the root sends (read before the sync: the
        # client clears it only after its next gradient).
        behind = bool(getattr(client, "state_behind", False))
        try:
            root = int(client.begin_state_sync())
        except IterationAbortedError:
            raise
        except GraddError as e:
            self._fail(e)
        rank = self._rank
        load = (self.unsynced or behind) and rank != root

        def on_error(e):
            if isinstance(e, IterationAbortedError):
                raise e
            self._fail(e)

        chunk = self._broadcast_bytes
        _state_sync.broadcast_tensors(
            client, _state_sync.module_states(self._module), chunk, on_error, root=root
        )
        for state_dict_fn, load_state_dict_fn in self.states:
            blob = None
            if rank == root:
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
                # weights_only=False (torch 2.6's torch.load defaults to True
                # and refuses non-tensor objects; 1.13 has the argument, False).
                load_state_dict_fn(
                    torch.load(io.BytesIO(buf.numpy().tobytes()), weights_only=False))
        self.unsynced = False
