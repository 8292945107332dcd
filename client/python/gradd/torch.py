"""gradd.torch: a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

::

    from gradd.torch import DistributedDataParallel as DDP
    model = DDP(model)                 # rank/world: process group or RANK, ...
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward() # grads are averaged when this returns
        opt.step()

Rank, world and job id come from torch's process group when there is one
(``dist.init_process_group`` called, or ``process_group=``), otherwise
from the launcher's environment, so no ``init_process_group`` is needed
(gradd/_world.py). The node's gradd daemon (socket from ``socket=``,
``$GRADD_SOCKET`` or the daemon's default path) does the communication.
Gradients live in bucket memory shared with the daemon:
autograd's gradient accumulator of every parameter is hooked so that a
bucket is handed to the daemon as soon as its last gradient is ready
(overlapping the rest of backward), and a callback queued on the autograd
engine waits for every bucket before ``backward()`` returns. ``.grad`` follows
torch's rules exactly (see gradd/_reducer.py): a parameter nobody used keeps
``grad is None``; the first gradient a parameter gets is moved into its view
of the bucket and ``.grad`` points there from then on.

Environment (torchrun's names; without a process group): RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK / NODE_RANK, MASTER_ADDR,
MASTER_PORT; gradd's: GRADD_SOCKET, GRADD_JOB, GRADD_COORDINATOR (the
rendezvous coordinator's host, default MASTER_ADDR; see gradd/_world.py).

Module map: _world (who am I, job id), _params, _attach (the client),
_state_sync, _reducer (autograd hooks, .grad rules), _rebuild, _join /
_trainer_join (uneven inputs), _sparse, _cuda, _comm_hooks / _trainer_hooks
/ _hook_group, _ddp_logging, _restart (rank restart and re-formation). The
DDP builds their objects (``_attach``), giving each what it needs; none of
them reads the DDP's attributes.
"""
from __future__ import annotations

import os
import time
import warnings
from typing import List, Optional, Sequence, Union

import torch  # the real torch: this module is gradd.torch, imports are absolute

# First: an unsupported torch fails here, naming its version, before any
# other torch API is used or a C++ extension built against torch is loaded.
from gradd import _torch_compat  # isort: skip
from torch.distributed.algorithms.join import Joinable

from torch.distributed.algorithms.join import _JoinConfig

import gradd._C as _C
from gradd import _attach, _comm_hooks, _cuda, _ddp_logging, _deprecation, _params, _rebuild
from gradd import _overlap, _restart
from gradd import _state_sync, _world
from gradd import _join  # join() for uneven inputs
from gradd import distributed as _distributed  # noqa: F401  (registers torch.distributed's backend "gradd"; off without gradd._c10d)
from gradd._C import GraddError, IterationAbortedError
from gradd import _reducer
from gradd._reducer import Reducer
from gradd._sparse import SparseReducer
from gradd._trainer_hooks import TrainerComm

__all__ = ["DistributedDataParallel", "GraddError", "IterationAbortedError", "OptimizerWrapper"]

_MiB = 1 << 20

# The constructor's keyword arguments an attach uses (``_attach_options``).
_ATTACH_OPTIONS = (
    "rank_restart_grace_ms", "min_nodes", "divide_by_initial_world_after_reformation", "socket",
    "job_id", "rank", "world_size", "local_rank", "local_world_size", "node_rank",
    "coordinator", "first_bucket_cap_mb", "broadcast_chunk_mb", "init_sync",
    "connect_timeout", "attach_timeout", "wait_timeout",
)


def _restart_property(name: str, default, doc: str) -> property:
    """A read-only DDP property answered by its RankRestart object
    (gradd/_restart.py); `default` before an attach."""

    def get(self):
        restart = self.__dict__.get("_restart")
        return getattr(restart, name) if restart is not None else default

    return property(get, doc=doc)


class DistributedDataParallel(_overlap.ForwardOverlapAPI, torch.nn.Module, Joinable,
                              _torch_compat.DDPClassAPI):
    """Data parallelism through the node's gradd daemon.

    Takes torch DDP's constructor arguments (torch 1.13's and 2.6's, see
    docs/torch2.md: ``device_mesh`` (1-D), ``init_sync``, ``bucket_cap_mb=None``;
    ``delay_all_reduce_named_params``, ``param_to_hook_all_reduce`` and
    ``mixed_precision`` are refused by name) and follows torch's semantics
    (torch 2.x's where 1.13 differs; client/python/README.md "Using it" has
    the full list): torch's ``.grad`` rules exactly, with or without
    ``find_unused_parameters``; only a backward after a DDP forward with
    gradient sync is synchronised (``no_sync()``,
    ``require_backward_grad_sync``); ``static_graph`` /
    ``_set_static_graph()``; every parameter and buffer broadcast from rank 0
    at construction, the buffers before each synced forward with
    ``broadcast_buffers``; several models per process, each its own daemon
    job (the n-th model on an explicit job id gets ``<job id>/<n>``; ranks
    construct them in the same order); ``_get_ddp_logging_data()``. gradd
    always reduces in place in bucket views (``gradient_as_bucket_view=False``
    gives the same values). CUDA modules (one GPU, ``device_ids=[it]`` or
    None) get ``.grad`` views into device memory the daemon allocated
    (gradd/_cuda.py); CPU modules need ``device_ids``/``output_device`` None;
    ``dim`` and ``check_reduction`` are accepted for compatibility.

    ``process_group``: None means torch's default group when one is
    initialised (else the launcher's environment); a subgroup
    (``dist.new_group(ranks)``) makes this DDP a job of exactly those ranks.
    Pickling (``torch.save(ddp)``, ``copy.deepcopy``) works as torch's: the
    copy re-attaches to the daemon at its first forward (see
    ``__getstate__``), and a DDP over a subgroup refuses, as torch's does.

    gradd-specific keyword arguments: ``socket``, ``job_id``, ``rank``,
    ``world_size``, ``local_rank``, ``local_world_size``, ``node_rank``,
    ``coordinator`` (default from the environment, see the module doc),
    ``bucket_cap_mb="auto"`` (the daemon tries a few caps after the bucket
    rebuild and keeps the fastest; every rank then re-plans at the
    iterations it names), ``first_bucket_cap_mb`` (None: the daemon's 1
    MiB), ``broadcast_chunk_mb``
    (largest single broadcast; default 64), ``connect_timeout``,
    ``attach_timeout``, ``wait_timeout`` (seconds), ``rebuild_buckets``
    (default True: re-plan buckets after the first iteration as torch does;
    see gradd/_rebuild.py).

    Rank restart (``rank_restart_grace_ms=``, else
    ``$GRADD_RANK_RESTART_GRACE_MS``, else the daemon's setting;
    client/python/README.md "Rank restart", gradd/_restart.py): with a grace
    > 0 a trainer whose process dies may be started again (same RANK /
    LOCAL_RANK, same job id, which must be explicit, same model) within the
    grace and re-attaches to the running job. The others' iteration is
    applied by nobody: their ``backward()`` raises
    ``gradd.IterationAbortedError`` and ``should_commit()`` is False until
    the next successful backward; skip the optimizer step and retry the
    batch (or let ``ddp.steps(opt, total)`` / ``OptimizerWrapper`` do it).
    Before the next iteration every rank takes part in the state sync
    (parameters, buffers, every ``register_state(...)``) from a rank that
    holds the job's state; ``sync_state()`` runs it early. ``restarted``,
    ``restart_iteration`` and ``iterations_aborted`` say what happened
    (``rejoined`` / ``rejoin_iteration``: deprecated names).

    Node loss and arrival (``min_nodes=``, else ``$GRADD_MIN_NODES``, else
    the daemon's; README "Node loss and arrival", docs/operations.md): a
    multi-node job with min_nodes > 0 goes on when a node dies (while
    min_nodes are left) and takes one back at an iteration boundary, a
    re-formation that aborts one iteration on every rank as a rank restart
    does and runs the state sync. Global ranks never change;
    ``live_world_size`` says how many take part now, ``epoch`` how many
    re-formations there were. Gradients are averaged over the live world,
    or over the initial one with
    ``divide_by_initial_world_after_reformation=True``, named for when it
    applies: ``divide_by_initial_world_size``, its deprecated former name
    (docs/deprecations.md), is torch's ``join()`` argument, about uneven
    inputs, which ``join()`` keeps.
    Bucket rebuild is off, as with a grace.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        device_ids: Optional[Sequence] = None,
        output_device=None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        process_group=None,
        # None: the daemon's default (25, as torch); "auto": the daemon's
        # autotune picks it (docs/operations.md "Bucket cap autotune").
        bucket_cap_mb: Union[float, str, None] = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        # torch 2.x's, in its order (only their defaults are supported but
        # device_mesh's: see _torch_compat.refuse_unsupported)
        delay_all_reduce_named_params=None,
        param_to_hook_all_reduce=None,
        mixed_precision=None,
        device_mesh=None,
        *,
        init_sync: bool = True,  # torch 2.7's: False skips the initial broadcast
        # gradd's (class doc): where the daemon is and who this trainer is
        socket: Optional[str] = None, job_id: Optional[str] = None,
        rank: Optional[int] = None, world_size: Optional[int] = None,
        local_rank: Optional[int] = None, local_world_size: Optional[int] = None,
        node_rank: Optional[int] = None, coordinator: Optional[str] = None,
        first_bucket_cap_mb: Optional[float] = None, broadcast_chunk_mb: float = 64,
        connect_timeout: float = 10.0, attach_timeout: float = 120.0,
        wait_timeout: float = 600.0,
        rebuild_buckets: bool = True,  # gradd/_rebuild.py
        # rank restart and node loss (gradd/_restart.py)
        rank_restart_grace_ms: Optional[int] = None, min_nodes: Optional[int] = None,
        divide_by_initial_world_after_reformation: bool = False,
        divide_by_initial_world_size: Optional[bool] = None,  # deprecated name of the above
    ):
        super().__init__()
        Joinable.__init__(self)  # join(): gradd/_join.py
        # torch's (its join hook sets it): join()'s divide, uneven inputs.
        self._divide_by_initial_world_size = True
        divide_by_initial_world_after_reformation = _deprecation.renamed_kwarg(
            "divide_by_initial_world_size", divide_by_initial_world_size,
            divide_by_initial_world_after_reformation, False)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        _torch_compat.refuse_unsupported(
            delay_all_reduce_named_params=delay_all_reduce_named_params,
            param_to_hook_all_reduce=param_to_hook_all_reduce, mixed_precision=mixed_precision)
        # torch 2.x: a 1-D device mesh means its process group.
        process_group = _torch_compat.device_mesh_group(device_mesh, process_group)
        if device_mesh is not None:
            self.device_mesh = device_mesh
        _deprecation.check_reduction(check_reduction)  # torch's deprecated argument
        # torch.compile(ddp): gradd's package runs eagerly, the module compiled.
        _torch_compat.prepare_compile()
        # Compiled autograd: unsupported, said at once (and at each forward).
        _torch_compat.refuse_compiled_autograd("gradd.torch.DistributedDataParallel()")
        ignore, named, sparse_named = _params.select(module)
        # CPU, or one GPU (gradd/_cuda.py): gradients then live in device
        # memory the daemon allocates on that GPU.
        self._device = _cuda.module_device(module)
        device_ids, output_device = _cuda.check_device_ids(
            self._device, device_ids, output_device
        )
        _params.check_dense(named)

        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        # torch 2.x: None means the default 25 MiB (bucket_bytes_cap_default;
        # dynamo's DDPOptimizer reads bucket_bytes_cap).
        self.bucket_bytes_cap_default = bucket_cap_mb is None
        # gradd: "auto" leaves the cap to the daemon, which tries a few after
        # the bucket rebuild and keeps the fastest (25 MiB until then).
        self.bucket_cap_auto = _params.bucket_cap_auto(bucket_cap_mb)
        self.bucket_cap_mb = (25 if bucket_cap_mb is None or self.bucket_cap_auto
                              else bucket_cap_mb)
        self.bucket_bytes_cap = int(self.bucket_cap_mb * _MiB)
        self.broadcast_bucket_size = int(250 * _MiB)  # torch's attribute; see broadcast_chunk_mb
        # torch 2.x's attributes that user code and torch read (plain values).
        self.__dict__.update(_torch_compat.torch2_ddp_attributes(module, ignore, self._device))
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = False
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.parameters_to_ignore = list(ignore)
        self.num_iterations = 0
        self._failure: Optional[BaseException] = None
        self._client = None
        self._reducer: Optional[Reducer] = None
        self._overlap = None  # _register_fused_optim(overlap_forward=True)
        # Bucket rebuild after the first iteration (gradd/_rebuild.py).
        self._rebuild_buckets_enabled = bool(rebuild_buckets)
        self._has_rebuilt_buckets = False
        self._param_names: List[str] = [n for n, _ in named]
        self._params: List[torch.nn.Parameter] = [p for _, p in named]
        self._sparse_names: List[str] = [n for n, _ in sparse_named]
        self._sparse_params: List[torch.nn.Parameter] = [p for _, p in sparse_named]
        # What torch's Logger keeps (_get_ddp_logging_data()).
        self._logging = _ddp_logging.RuntimeLog(self._params)
        # Rank restart (a grace > 0) and node loss (min_nodes > 0) need an
        # explicit job id (_restart.py).
        _restart.check_settings(rank_restart_grace_ms, min_nodes, job_id, process_group)
        # What an attach needs, again after unpickling (see __setstate__):
        # the keyword arguments named in _ATTACH_OPTIONS, as given.
        given = locals()
        self._attach_options = {k: given[k] for k in _ATTACH_OPTIONS}
        for k in ("init_sync", "divide_by_initial_world_after_reformation"):
            self._attach_options[k] = bool(given[k])
        # -- who we are (gradd/_world.py): torch's process group when there
        # is one, else the launcher's environment; the job id is agreed here.
        self._attach(self._resolve_world(process_group))
        if static_graph:
            self._set_static_graph()

    def _resolve_world(self, process_group) -> "_world.World":
        return _attach.resolve_world(process_group, self._device, self._attach_options)

    def _attach(self, world: "_world.World") -> None:
        """Attaches to the daemon as `world` says, broadcasts rank 0's state
        and builds the attach's components, each given what it needs
        (construction, and the first forward of an unpickled copy)."""
        opts = self._attach_options
        self._world = world
        self.process_group = world.group
        self._is_subgroup = world.is_subgroup
        for name in ("rank", "world_size", "local_rank", "local_world_size", "node_rank",
                     "num_nodes", "job_id"):
            setattr(self, name, getattr(world, name))
        who = f"job '{self.job_id}', rank {self.rank}"
        self._client, self._bcast_bytes = _attach.attach_client(
            world, self.module, self._param_names, self._params, device=self._device,
            device_ids=self.device_ids,
            # None: the daemon's default (25 MiB unless its config says
            # otherwise, e.g. `auto`).
            bucket_cap_mb=(0 if self.bucket_bytes_cap_default or self.bucket_cap_auto
                           else self.bucket_cap_mb),
            bucket_cap_auto=self.bucket_cap_auto, opts=opts)
        client = self._client

        # -- rank restart and re-formation (gradd/_restart.py) -------------
        explicit_id = bool(opts.get("job_id") or os.environ.get(_restart.JOB_ENV))
        self._restart = _restart.RankRestart(
            client, explicit_job_id=explicit_id, module=self.module, rank=self.rank,
            world_size=self.world_size, broadcast_bytes=self._bcast_bytes, fail=self._fail)
        if self._restart.enabled:
            # A rebuild is a job-wide switch a restarted rank (or a node that
            # comes back) cannot know it missed: such jobs keep their first
            # plan.
            self._rebuild_buckets_enabled = False

        # -- every rank starts from rank 0's state -------------------------
        # (not a restarted rank: the survivors are not in this broadcast; it
        # gets the job's state at its first forward's state sync)
        # init_sync=False (torch 2.7's): the user made the ranks equal.
        if self.world_size > 1 and not self._restart.restarted and opts.get("init_sync", True):
            # torch 2.x with broadcast_buffers=False: parameters only.
            buffers = _torch_compat.init_syncs_buffers(self.broadcast_buffers)
            self._broadcast_tensors(_state_sync.module_states(self.module, buffers=buffers))

        # -- gradient views and autograd hooks -----------------------------
        # .grad is left alone here (None stays None, as in torch): a view is
        # handed out when the parameter gets a gradient or the average.
        views = [_rebuild.gradient_view(client, i, p) for i, p in enumerate(self._params)]
        self._reducer = reducer = Reducer(
            client, self._params, self._param_names, views,
            find_unused_parameters=self.find_unused_parameters, who=who, fail=self._fail,
            done=self._backward_done, device=self._device,
            sparse=SparseReducer(
                list(self._sparse_names), list(self._sparse_params), self.rank,
                self.world_size, lambda buf, root: self._broadcast_tensors([buf], root),
            ),
        )
        if self.static_graph:  # re-attached after unpickling
            reducer.static_graph = True
        reducer.abort_quietly = bool(self.__dict__.get("_abort_quietly", False))
        self._rebuild = _rebuild.BucketRebuild(
            client, self._params, views, self._fail, enabled=self._rebuild_buckets_enabled)
        self._hooks = _comm_hooks.CommHooks(
            client, reducer, on_trainer_path=self._hook_runs_in_trainer,
            trainer_comm=lambda state, hook: TrainerComm(
                reducer, state, hook, world=world, socket=opts["socket"],
                wait_timeout=opts["wait_timeout"],
                first_bucket_cap_mb=opts["first_bucket_cap_mb"],
                bucket_cap_mb=self.bucket_cap_mb, broadcast=self._broadcast_tensors))
        self._uneven_inputs = _join.UnevenInputs(
            client, reducer, self.module, rank=self.rank, world_size=self.world_size,
            device=self._device, broadcast_bytes=self._bcast_bytes,
            broadcast=self._broadcast_tensors, who=who, end_join_mode=self._end_join_mode)
        self._needs_attach = False

    def _hook_runs_in_trainer(self) -> None:
        """A communication hook runs in the trainer: the daemon re-plans
        buckets from the ready order it sees, and in this mode it sees
        none, so the plan stays DDP's initial one."""
        self._rebuild_buckets_enabled = False
        self._rebuild.enabled = False

    # ------------------------------------------------------------- pickling
    # As torch 1.13's DDP: the module, its parameters and the constructor's
    # settings travel; the attach (client and the components over it: torch's
    # reducer) and the process group do not. A DDP over a subgroup refuses,
    # as torch's (its members are not known again on load). Loading talks to
    # no one (attaching is collective; a rank that only looks at a checkpoint
    # must not block): the copy attaches at its first forward, as a new job
    # (a fresh agreed id, or the n-th model of an explicit one) of the default
    # group's ranks or the environment's world, and every rank must run that
    # forward. Comm hooks and registered states (live objects of this
    # process) are not kept, as torch keeps no comm hook.
    _NOT_PICKLED = (
        "_client", "_reducer", "process_group", "_failure", "_restart", "_comm_hooks",
        "_in_backward_params", "_world", "_rebuild", "_hooks", "_uneven_inputs", "_overlap",
    )

    def __getstate__(self):
        if self.__dict__.get("_is_subgroup"):
            self._log_and_throw(
                RuntimeError,
                "DDP Pickling/Unpickling are only supported when using DDP with the default "
                "process group. That is, when you have called init_process_group and have "
                "not passed process_group argument to DDP constructor "
                f"(gradd job '{self.job_id}' runs on a subgroup)",
            )
        self._finish_overlap()
        attrs = dict(self.__dict__)
        for key in self._NOT_PICKLED:
            attrs.pop(key, None)
        return attrs

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("require_forward_param_sync", True)
        self.__dict__.setdefault("require_backward_grad_sync", True)
        # Comm hooks are not kept, as torch's.
        self.__dict__.update(_comm_hooks=[], _lazy_init_ran=False, _in_backward_params=[])
        _deprecation.migrate_pickled(self.__dict__)
        self._client = None
        self._reducer = self._overlap = None
        self._hooks = _comm_hooks.CommHooks(None, None)  # says "detached"
        self._failure = None
        self._logging.error = None
        self.process_group = _world.default_group()
        self._has_rebuilt_buckets = False
        self._needs_attach = True

    # --------------------------------------------------------- rank restart
    def register_state(self, state_dict_fn, load_state_dict_fn) -> None:
        """Registers state that a restarted rank must get from the others
        at its state sync, besides parameters and buffers: the root sends
        ``torch.save(state_dict_fn())``, a rank that re-attached calls
        ``load_state_dict_fn(torch.load(...))``. Any number, applied in
        registration order; every rank must register the same ones in the
        same order (e.g. ``optimizer.state_dict, optimizer.load_state_dict``,
        an LR scheduler's, a step counter's)."""
        self._restart.register_state(state_dict_fn, load_state_dict_fn)

    def sync_state(self) -> bool:
        """Runs the rank restart state sync now if one is due (it runs at
        the start of forward anyway). Call it at the top of the training
        loop when the batch depends on registered state (the step): a
        restarted rank then picks the job's batch. Returns whether it ran;
        collective when due (every rank is at the same point)."""
        self._raise_if_failed()
        restart = self.__dict__.get("_restart")
        if self._client is None or restart is None:
            return False
        return restart.sync_state(self._client)

    def steps(self, optimizer, total: int):
        """The job's steps for a loop that survives a killed rank with one
        line changed, ``for step in ddp.steps(opt, total):`` in place of
        ``for step in range(total):``. Wraps `optimizer` in place
        (gradd.torch.OptimizerWrapper, client/python/gradd/_optim.py): its
        state and the step count go to a restarted rank at the state sync,
        ``opt.step()`` skips the step of an aborted iteration and the same
        step comes again (the batch is retried), and a restarted rank starts
        at the step the job is at. Yields 0, 1, ... until `total` steps are
        committed. The loop must draw a step's batch from the step alone
        (see the module doc of _optim.py for what else it must do)."""
        from gradd._optim import wrap_in_place

        return wrap_in_place(self, optimizer).steps(total)

    def should_commit(self) -> bool:
        """False after a backward whose iteration was aborted by a rank
        restart (skip the optimizer step), until the next successful
        backward; True otherwise."""
        restart = self.__dict__.get("_restart")
        return restart is None or not restart.last_aborted

    restarted = _restart_property("restarted", False, """True when this
        process re-attached to its running job after a restart
        (rank_restart_grace_ms > 0), or entered it as a trainer of a node
        admitted at a re-formation.""")
    restart_iteration = _restart_property("restart_iteration", None, """The
        job's iteration this rank goes on at after restarting (its first),
        None when it did not. A restarted rank, or a trainer of a node
        admitted into its running job: the iteration every node's daemon
        numbers the same ("re-formed ... goes on at iteration N" in their
        logs, `graddctl job`), counted from 1 when the job formed.""")
    # Their names until this release ("join" is only uneven inputs).
    rejoined = _deprecation.renamed_property("rejoined", "restarted")
    rejoin_iteration = _deprecation.renamed_property("rejoin_iteration", "restart_iteration")

    @property
    def iterations_aborted(self) -> int:
        """Iterations aborted by rank restarts since this rank attached."""
        client = self.__dict__.get("_client")
        return int(client.iterations_aborted) if client is not None else 0

    min_nodes = _restart_property("min_nodes", 0, """The job's min_nodes as
        the daemon answered (0: a lost node fails the job).""")

    @property
    def live_world_size(self) -> int:
        """Global ranks taking part now: ``world_size`` until a node of the
        job is lost or added (global ranks never change)."""
        client = self.__dict__.get("_client")
        if client is None:
            return self.world_size
        return int(getattr(client, "live_world_size", self.world_size))

    @property
    def epoch(self) -> int:
        """Re-formations of the job's network so far (node lost, node
        added, a rank restarted on a multi-node job)."""
        client = self.__dict__.get("_client")
        return int(getattr(client, "epoch", 0)) if client is not None else 0

    rank_restart_grace_ms = _restart_property("grace_ms", 0, """The grace the
        job runs with (0: none).""")

    # ------------------------------------------------------------------ info
    @property
    def client(self) -> "_C.Client":
        """The underlying gradd._C.Client."""
        return self._client

    @property
    def num_buckets(self) -> int:
        """The model's buckets (gradd's own used-map bucket not counted)."""
        return len(self.bucket_info())

    def bucket_info(self) -> List[dict]:
        """Per model bucket, in plan order: dtype, size_bytes and the names
        of its parameters (gradd's own used-map bucket, which holds no model
        parameter, is not listed)."""
        return _attach.bucket_info(self._client, self._param_names)

    @property
    def parameter_names(self) -> List[str]:
        """Names of the registered parameters, in registration order."""
        return list(self._param_names)

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        """torch's: runtime stats for the first 10 iterations, then every
        `sample_rate`-th. gradd measures every iteration at no cost (the
        client timestamps what it does anyway); as torch's logger, the
        reported ``iteration`` and per-iteration times are those of the last
        sampled iteration (gradd/_ddp_logging.py), the averages cover every
        iteration."""
        self._logging.set_sample_rate(sample_rate)

    def _build_params_for_reducer(self):
        """torch's: (the parameters DDP reduces, in registration order, and
        whether each expects a sparse gradient)."""
        return _params.params_for_reducer(self.module, self._params, self._sparse_params)

    def _build_debug_param_to_name_mapping(self, parameters) -> dict:
        """torch's: {index in `parameters`: fully qualified name}, checking
        (with torch's messages) that `parameters` are exactly the ones DDP
        reduces."""
        named = list(zip(self._param_names, self._params)) + list(
            zip(self._sparse_names, self._sparse_params))
        return _params.debug_param_to_name_mapping(parameters, named, self._log_and_throw)

    def _distributed_rank(self) -> int:
        """torch's: this trainer's rank in the DDP's group (the job's rank
        without a process group)."""
        if self.process_group is not None:
            import torch.distributed as dist

            return dist.get_rank(self.process_group)
        return self.rank

    def _get_ddp_logging_data(self) -> dict:
        """torch's DDP logging data (the main keys, same names and types;
        times in nanoseconds, measured by this client: forward = the module's
        forward, backward compute = end of forward to the last gradient,
        backward comm = first bucket handed over to all averaged)."""
        return self._logging.data(
            self, self.__dict__.get("_client"), self.__dict__.get("_reducer"))

    # --------------------------------------------------------------- forward
    def forward(self, *inputs, **kwargs):
        self._raise_if_failed()
        # Before anything collective: every rank of a job refuses alike.
        _torch_compat.refuse_compiled_autograd("forward")
        if self._client is None and self.__dict__.get("_needs_attach"):
            # An unpickled copy, a new job (see __setstate__).
            self._attach(self._resolve_world(None))
        if self._client is None:
            raise RuntimeError(
                f"gradd.torch.DistributedDataParallel (job '{self.job_id}', rank "
                f"{self.rank}) was shut down; use .module to run the model locally"
            )
        # Rank restart: the state sync, before anything else collective.
        self._restart.sync_state(self._client)
        overlap = self._overlap  # forward overlap (gradd/_overlap.py)
        if overlap is not None:
            overlap.before_forward(join=self._join_config.enable, rebuild=self._rebuild)
        grad_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if grad_sync:
            if self._reducer.backward_in_progress:
                self._fail(RuntimeError(
                    "Expected to have finished reduction in the prior iteration before starting "
                    "a new one: the previous backward() did not complete "
                    f"(job '{self.job_id}', rank {self.rank})"))
            self._logging.sample(self.num_iterations, self._reducer)
            self.num_iterations += 1
        # Where torch's forward calls reducer._rebuild_buckets(): any
        # grad-enabled forward, between iterations.
        if torch.is_grad_enabled() and not self._reducer.backward_in_progress:
            if self._rebuild.maybe_rebuild(find_unused_parameters=self.find_unused_parameters,
                                           static_graph=self.static_graph):
                self._has_rebuilt_buckets = True
        sync_buffers = (self.require_forward_param_sync and self.broadcast_buffers
                        and self.world_size > 1)
        if self._join_config.enable:
            # Join mode (gradd/_join.py): tell the daemon this rank takes part;
            # buffers come from the highest active rank instead of rank 0.
            if grad_sync:
                self._uneven_inputs.on_forward(
                    self._join_config, sync_buffers=sync_buffers,
                    divide_by_initial_world_size=self._divide_by_initial_world_size)
        elif sync_buffers:
            buffers = _state_sync.module_buffers(self.module)
            if buffers:
                self._broadcast_tensors(buffers)
        if self.device_ids:
            # As torch's DDP: inputs go to the module's device.
            inputs = _cuda.to_device(inputs, self._device)
            kwargs = _cuda.to_device(kwargs, self._device)
        if not self._lazy_init_ran:
            self._lazy_init()
        t0 = time.monotonic_ns()
        with _torch_compat.inside_ddp_forward(self):  # torch.compile's DDPOptimizer
            output = self.module(*inputs, **kwargs)
        if overlap is not None:
            overlap.finish()  # the buckets no submodule waited for
        if grad_sync:
            self.require_forward_param_sync = True
            self._reducer.prepare_for_backward(t0)
            output = self._reducer.wrap_output(output)
        else:
            self.require_forward_param_sync = False
        return output

    # ------------------------------------------------------- comm hooks
    def register_comm_hook(self, state, hook):
        """Any hook torch accepts: torch's allreduce, fp16/bf16 and PowerSGD
        hooks run in the daemon, every other one in this process, over the
        job's gradd group when its state means the DDP's ranks, else over the
        group its state names (see gradd/_comm_hooks.py, _hook_group.py)."""
        self._hooks.register(state, hook)
        self.__dict__.setdefault("_comm_hooks", []).append((hook, state))  # torch 2.x's record

    def _register_builtin_comm_hook(self, comm_hook_type):
        self._hooks.register_builtin(comm_hook_type)

    # ------------------------------------------------------------- join
    # Uneven inputs: the daemon fills in for ranks that ran out of inputs
    # (no shadow collectives here); see gradd/_join.py. With a hook that runs
    # in the trainer, the trainers shadow it as torch does (_trainer_join.py).
    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False):
        # CUDA modules too: the daemon stages join iterations' buckets
        # through host memory (server/engine/reduce/host_staging.h).
        self._finish_overlap()
        return _join.GraddJoin([self], enable, throw_on_early_termination,
                               divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs):
        # As torch's DDP join hook: join()'s divide, kept on the DDP.
        self._divide_by_initial_world_size = bool(
            kwargs.get("divide_by_initial_world_size", True))
        return _join.GraddJoinHook(self._finish_join)

    @property
    def join_device(self):
        return self._device

    @property
    def join_process_group(self):
        return _join.non_member_group()

    def _finish_join(self) -> None:
        """This rank ran out of inputs (the join hook's post hook): wait for
        every rank, then copy the authoritative rank's model (torch's
        ``_authoritative_rank``, which torch's tests read)."""
        self._finish_overlap()
        uneven = self._uneven_inputs
        self._authoritative_rank = uneven.finish(
            self._join_config, divide_by_initial_world_size=self._divide_by_initial_world_size)
        uneven.sync_final_model(self._authoritative_rank)

    def _end_join_mode(self) -> None:
        self._join_config = _JoinConfig.construct_disabled_join_config()

    def _set_static_graph(self):
        """As torch: call it right after construction, before training."""
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.")
            return
        reducer = self._reducer  # None in an unpickled copy before its first forward
        if reducer is not None and (reducer.iterations_done > 0 or reducer.backward_in_progress):
            self._log_and_throw(RuntimeError, f"{_reducer.STATIC_GRAPH_TOO_LATE} ({reducer.who})")
        _overlap.refuse_static_graph(self.__dict__.get("_overlap"))
        self.static_graph = True
        if reducer is not None:
            reducer.static_graph = True
        if self.find_unused_parameters:
            warnings.warn(_reducer.STATIC_GRAPH_FINDS_UNUSED)

    # ------------------------------------------------ torch 2.x's internals
    # (and _torch_compat.DDPClassAPI's). No c10d ``reducer``: code that
    # drives torch's Reducer directly cannot drive gradd's daemon.
    def will_sync_module_buffers(self) -> bool:
        """torch's: whether the next forward broadcasts the buffers."""
        return bool(self.require_forward_param_sync and self.broadcast_buffers
                    and _state_sync.module_buffers(self.module))

    def _set_ddp_sink_clone(self, val: bool) -> None:
        """torch 2.x's switch; gradd's sink always clones the outputs
        (in-place changes of the loss stay allowed), so only recorded."""
        self._ddp_sink_clone = bool(val)

    def _check_reducer_finalized(self) -> None:
        """torch's: raises when a synced backward is still in progress."""
        reducer = self.__dict__.get("_reducer")
        if reducer is not None and reducer.backward_in_progress:
            self._log_and_throw(RuntimeError, "Expected to have finished reduction in the prior "
                                "iteration before starting a new one (gradd job "
                                f"'{self.job_id}', rank {self.rank})")

    # ---------------------------------------------------------------- close
    def shutdown(self) -> None:
        """Detaches from the daemon. Gradients stay readable (the memory stays
        mapped while views exist) but are no longer averaged."""
        self._finish_overlap(quietly=True)
        client, self._client = self.__dict__.get("_client"), None
        hooks = self.__dict__.get("_hooks")
        if hooks is not None:
            hooks.detach()
        reducer = self.__dict__.get("_reducer")
        if reducer is not None:
            if isinstance(reducer.comm, TrainerComm):  # its gradd group
                reducer.comm.close()
            reducer.detach()
        if client is not None:
            client.detach()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # never raise from a finaliser
            pass

    # ------------------------------------------------------------ internals
    def _broadcast_tensors(self, tensors, root: int = 0) -> None:
        """Overwrites `tensors` with global rank `root`'s, through the daemon."""
        self._raise_if_failed()
        _state_sync.broadcast_tensors(
            self._client, tensors, self._bcast_bytes, self._fail, root=root
        )

    def _fail(self, error: BaseException):
        """Records the first error: the job can't continue after it. An
        iteration aborted by a rank restart is not a failure: the iteration
        state is reset and the error raised (gradd/_restart.py)."""
        if isinstance(error, IterationAbortedError):
            reducer = self.__dict__.get("_reducer")
            if reducer is not None:
                reducer.abort_iteration()
            restart = self.__dict__.get("_restart")
            if restart is not None:
                restart.on_aborted()
            raise error
        if self._failure is None:
            self._failure = error
        self._logging.record_error(f"{type(error)}: {error}", first_only=True)
        raise error

    def _backward_done(self) -> None:
        """A synced backward completed (the reducer's end): commit again;
        the optimizers in backward step on the averaged gradients."""
        restart = self.__dict__.get("_restart")
        if restart is not None:
            restart.on_backward_done()
        if self._in_backward_params:
            _torch_compat.step_in_backward_optimizers(self._in_backward_params)

    def _lazy_init(self) -> None:
        """torch 2.x's, at the first forward: parameters given optimizers by
        ``torch.distributed.optim._apply_optimizer_in_backward`` step after
        their gradients are averaged, not on the local ones."""
        self._in_backward_params = _torch_compat.take_in_backward_optimizers(self._params)
        self._lazy_init_ran = True

    def _log_and_throw(self, err_type, err_msg: str):
        """As torch's: the error is kept for _get_ddp_logging_data()
        (``has_error``, ``error``) and raised."""
        self._logging.record_error(f"{err_type}: {err_msg}")
        raise err_type(err_msg)

    def _abort_iterations_quietly(self) -> None:
        """OptimizerWrapper's switch: an aborted iteration ends ``backward()``
        normally (``should_commit()`` False) instead of raising."""
        self._abort_quietly = True
        reducer = self.__dict__.get("_reducer")
        if reducer is not None:
            reducer.abort_quietly = True

    def _raise_if_failed(self):
        if self._failure is not None:
            raise RuntimeError(
                f"gradd job '{self.job_id}' (rank {self.rank}) failed earlier: {self._failure}"
            ) from self._failure


# The rank restart pattern inside the optimizer (after the class it checks for).
from gradd._optim import OptimizerWrapper  # noqa: E402
