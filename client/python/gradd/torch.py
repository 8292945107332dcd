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
MASTER_PORT; gradd's: GRADD_SOCKET, GRADD_JOB (job id; default: one the
ranks agree on, see gradd/_world.py), GRADD_COORDINATOR (the rendezvous
coordinator's host, default MASTER_ADDR; never MASTER_PORT: the daemons
rendezvous on their own port, 29600 unless configured, and the daemon on
that host serves it on demand).

Module map: _world (who am I, job id), _state_sync (rank 0's state),
_reducer (autograd hooks, .grad rules), _rebuild (bucket re-plan), _join
(uneven inputs), _sparse, _cuda, _comm_hooks / _trainer_hooks / _hook_group /
_trainer_join (comm hooks), _ddp_logging (``_get_ddp_logging_data``),
_restart (rank restart: state sync, aborted iterations).
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from typing import List, Optional, Sequence

import torch  # the real torch: this module is gradd.torch, imports are absolute

# First: an unsupported torch fails here, naming its version, before any
# other torch API is used or a C++ extension built against torch is loaded.
from gradd import _torch_compat  # isort: skip
from torch.distributed.algorithms.join import Joinable

import gradd._C as _C
from gradd import _cuda, _ddp_logging, _rebuild, _restart, _state_sync, _world
from gradd import _join  # join() for uneven inputs
from gradd import distributed as _distributed  # noqa: F401  (registers torch.distributed's backend "gradd"; off without gradd._c10d)
from gradd._C import GraddError, IterationAbortedError
from gradd._reducer import Reducer
from gradd._sparse import SparseReducer, sparse_parameter_ids
from gradd._trainer_hooks import TrainerComm

__all__ = ["DistributedDataParallel", "GraddError", "IterationAbortedError", "OptimizerWrapper"]

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}

_MiB = 1 << 20


def _refuse_unsupported(**args) -> None:
    """torch 2.x constructor arguments gradd does not support: only their
    defaults are accepted; anything else is refused naming the argument."""
    for name, value in args.items():
        if value is not None:
            raise NotImplementedError(
                f"gradd.torch.DistributedDataParallel does not support torch's "
                f"{name}= argument (got {type(value).__name__}); leave it None or use "
                "torch.nn.parallel.DistributedDataParallel"
            )


class DistributedDataParallel(torch.nn.Module, Joinable):
    """Data parallelism through the node's gradd daemon.

    Takes torch DDP's constructor arguments (torch 1.13's and 2.6's, see
    docs/torch2.md: ``device_mesh`` (1-D), ``init_sync``, ``bucket_cap_mb=None``;
    ``delay_all_reduce_named_params``, ``param_to_hook_all_reduce`` and
    ``mixed_precision`` are refused by name) and follows torch's semantics
    (torch 2.x's where 1.13 differs):

    * gradients: torch's ``.grad`` rules exactly, with or without
      ``find_unused_parameters`` (a parameter some rank used ends with the
      same average on every rank; one nobody used keeps its ``.grad`` as it
      was, None included). gradd always reduces in place in bucket views, so
      ``gradient_as_bucket_view=False`` is accepted and gives identical
      results; ``.grad`` of a used parameter is its bucket view either way.
    * only a backward that follows a DDP forward with gradient sync is
      synchronised: backward through ``ddp.module(...)`` or through a
      forward under ``no_sync()`` (or ``require_backward_grad_sync=False``)
      accumulates locally, like torch.
    * ``static_graph=True`` / ``_set_static_graph()``: unused parameters,
      modules reused in one forward and reentrant activation checkpointing
      (a parameter's hook firing several times per backward) as torch allows
      them; without static graph such a second firing is torch's "marked
      ready twice" error.
    * every parameter and every buffer (``named_buffers()``, persistent or
      not) is broadcast from rank 0 at construction; with
      ``broadcast_buffers=True`` the buffers again before each forward that
      follows a synced one.
    * several models in one process (a GAN's generator and discriminator, a
      model and a wrapped copy): each is its own daemon job, with an id the
      ranks agree on per construction (gradd/_world.py); the n-th model a
      rank constructs on an explicit job id gets ``<job id>/<n>`` (the first
      keeps the id unchanged). Ranks must construct their models in the same
      order, as torch requires for process groups.
    * ``no_sync()``, ``require_backward_grad_sync``, ``_set_static_graph()``
      and ``_get_ddp_logging_data()`` (torch's main keys; times in ns as
      measured by this client).

    CUDA modules (all parameters and buffers on one GPU) take
    ``device_ids=[that GPU]`` (or None) as torch's; their ``.grad`` are views
    into device memory the daemon allocated (see gradd/_cuda.py); bucket
    rebuild (gradd/_rebuild.py), join() and communication hooks work on them
    as on CPU modules (the daemon stages join and hook buckets through host
    memory). CPU modules need ``device_ids``/``output_device`` None;
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
    ``first_bucket_cap_mb`` (None: the daemon's 1 MiB), ``broadcast_chunk_mb``
    (largest single broadcast; default 64), ``connect_timeout``,
    ``attach_timeout``, ``wait_timeout`` (seconds), ``rebuild_buckets``
    (default True: re-plan buckets after the first iteration as torch does;
    see gradd/_rebuild.py).

    Rank restart (``rank_restart_grace_ms=``, else
    ``$GRADD_RANK_RESTART_GRACE_MS``, else the daemon's setting; see
    gradd/_restart.py and client/python/README.md): with a grace > 0 a
    trainer whose process dies may be started again (same RANK /
    LOCAL_RANK, same job id, same model) within the grace and re-attaches to
    the running job instead of failing it. The job id must then be explicit
    (``job_id=`` or ``$GRADD_JOB``; ValueError otherwise). The other ranks
    pause; the iteration they were in is applied by nobody: their
    ``loss.backward()`` raises ``gradd.IterationAbortedError`` (a subclass
    of ``gradd.AbortedError``, a RuntimeError; the type survives autograd)
    and ``should_commit()`` is False until the next successful backward.
    The DDP is then ready for the same batch again::

        ddp.register_state(opt.state_dict, opt.load_state_dict)
        ddp.register_state(lambda: {"step": step}, load_step)
        while step < steps:
            ddp.sync_state()   # a restarted rank takes the job's step here
            x, y = batch(step)
            opt.zero_grad()
            try:
                loss_fn(ddp(x), y).backward()
            except gradd.IterationAbortedError:
                continue       # skip the optimizer step, retry the batch
            opt.step()
            step += 1

    Before the next iteration (at the start of forward, before the buffer
    broadcast and anything else collective, or at ``sync_state()``) every
    rank takes part in the state sync: the parameters and buffers and every
    ``register_state(state_dict_fn, load_state_dict_fn)`` (in registration
    order) go from a rank that holds the job's state to the restarted one.
    A restarted rank's constructor skips the construction-time broadcast
    from rank 0. ``rejoined``, ``rejoin_iteration`` and
    ``iterations_aborted`` say what happened. A launcher must restart the
    dead process alone (a supervisor); torchrun's elastic agent restarts
    the whole group, which is not a rank restart.

    Node loss and arrival (``min_nodes=``, else ``$GRADD_MIN_NODES``, else
    the daemon's min_nodes; docs/operations.md): a multi-node job with
    min_nodes > 0 goes on when one of its nodes dies (while at least
    min_nodes are left) and takes a node back (or a new one) at an iteration
    boundary. Each such event aborts one iteration on every rank, exactly as
    a rank restart does (the loop above handles it), and runs the state
    sync. Global ranks never change; ``live_world_size`` says how many take
    part now, ``epoch`` how many re-formations there were. Gradients are
    averaged over the live world, or over the initial one with
    ``divide_by_initial_world_size=True``. Bucket rebuild is off, as with a
    grace, and the job id must be explicit.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        device_ids: Optional[Sequence] = None,
        output_device=None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        process_group=None,
        bucket_cap_mb: Optional[float] = None,  # None: 25, as torch
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        # torch 2.x's, in its order (only their defaults are supported but
        # device_mesh's: see _refuse_unsupported)
        delay_all_reduce_named_params=None,
        param_to_hook_all_reduce=None,
        mixed_precision=None,
        device_mesh=None,
        *,
        init_sync: bool = True,  # torch 2.7's: False skips the initial broadcast
        socket: Optional[str] = None,
        job_id: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        local_rank: Optional[int] = None,
        local_world_size: Optional[int] = None,
        node_rank: Optional[int] = None,
        coordinator: Optional[str] = None,
        first_bucket_cap_mb: Optional[float] = None,
        broadcast_chunk_mb: float = 64,
        connect_timeout: float = 10.0,
        attach_timeout: float = 120.0,
        wait_timeout: float = 600.0,
        rebuild_buckets: bool = True,  # gradd/_rebuild.py
        rank_restart_grace_ms: Optional[int] = None,  # gradd/_restart.py
        min_nodes: Optional[int] = None,  # gradd/_restart.py (node loss)
        divide_by_initial_world_size: bool = False,  # after node loss
    ):
        super().__init__()
        Joinable.__init__(self)  # join(): gradd/_join.py
        self._divide_by_initial_world_size = True
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        _refuse_unsupported(
            delay_all_reduce_named_params=delay_all_reduce_named_params,
            param_to_hook_all_reduce=param_to_hook_all_reduce,
            mixed_precision=mixed_precision,
        )
        # torch 2.x: a 1-D device mesh means its process group.
        process_group = _torch_compat.device_mesh_group(device_mesh, process_group)
        if device_mesh is not None:
            self.device_mesh = device_mesh
        if check_reduction:
            warnings.warn(
                "The `check_reduction` argument in `DistributedDataParallel` "
                "module is deprecated. Please avoid using it.",
                FutureWarning,
                stacklevel=2,
            )
        # torch.compile(ddp): gradd's package runs eagerly, the module compiled.
        _torch_compat.prepare_compile()
        # Compiled autograd: unsupported, said at once (and at each forward).
        _torch_compat.refuse_compiled_autograd("gradd.torch.DistributedDataParallel()")
        ignore = _state_sync.ignored_names(module)
        named = [
            (n, p) for n, p in module.named_parameters() if p.requires_grad and n not in ignore
        ]
        # Sparse gradients (Embedding(sparse=True)) bypass the dense buckets:
        # see gradd/_sparse.py.
        sparse_ids = sparse_parameter_ids(module)
        sparse_named = [(n, p) for n, p in named if id(p) in sparse_ids]
        named = [(n, p) for n, p in named if id(p) not in sparse_ids]
        if not named and sparse_named:
            raise NotImplementedError(
                "gradd needs at least one dense parameter besides the sparse "
                f"ones ({', '.join(n for n, _ in sparse_named)})"
            )
        if not named:
            raise RuntimeError(
                "DistributedDataParallel is not needed when a module doesn't have any "
                "parameter that requires a gradient."
            )
        # CPU, or one GPU (gradd/_cuda.py): gradients then live in device
        # memory the daemon allocates on that GPU.
        self._device = _cuda.module_device(module)
        device_ids, output_device = _cuda.check_device_ids(
            self._device, device_ids, output_device
        )
        for n, p in named:
            if p.dtype not in _DTYPES:
                raise TypeError(
                    f"parameter '{n}' has dtype {p.dtype}; gradd reduces float32, "
                    "float64, float16 and bfloat16"
                )
            if p.layout != torch.strided:
                raise NotImplementedError(f"parameter '{n}' is not a dense tensor")

        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        # torch 2.x: None means the default 25 MiB (bucket_bytes_cap_default;
        # dynamo's DDPOptimizer reads bucket_bytes_cap).
        self.bucket_bytes_cap_default = bucket_cap_mb is None
        if bucket_cap_mb is None:
            bucket_cap_mb = 25
        self.bucket_cap_mb = bucket_cap_mb
        self.bucket_bytes_cap = int(bucket_cap_mb * _MiB)
        self.broadcast_bucket_size = int(250 * _MiB)  # torch's attribute; see broadcast_chunk_mb
        # torch 2.x's attributes that user code and torch read.
        self.device = self._device
        self.device_type = self.device.type
        self.is_multi_device_module = False
        self.mixed_precision = None
        self._delay_all_reduce_params: List[torch.nn.Parameter] = []
        self._delay_all_reduce_all_params = False
        self._module_parameters = [
            p for n, p in module.named_parameters() if n not in ignore
        ]
        self._comm_hooks: list = []
        self._use_python_reducer = False
        self._accum_grad_hooks: list = []
        self._lazy_init_ran = False
        self._ddp_sink_clone = True
        self._in_backward_params: List[torch.nn.Parameter] = []
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = False
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.parameters_to_ignore = list(ignore)
        self.num_iterations = 0
        self._failure: Optional[BaseException] = None
        self._logged_error: Optional[str] = None  # _get_ddp_logging_data()'s "error"
        self._logging_sample_rate = 100  # torch's kDDPRuntimeLoggingSampleRate
        self._client = None
        self._reducer: Optional[Reducer] = None
        # Bucket rebuild after the first iteration (gradd/_rebuild.py).
        self._rebuild_buckets_enabled = bool(rebuild_buckets)
        self._has_rebuilt_buckets = False
        self._param_names: List[str] = [n for n, _ in named]
        self._params: List[torch.nn.Parameter] = [p for _, p in named]
        self._sparse_names: List[str] = [n for n, _ in sparse_named]
        self._sparse_params: List[torch.nn.Parameter] = [p for _, p in sparse_named]
        # Rank restart: a grace > 0 needs an explicit job id (_restart.py).
        grace = _restart.requested_grace(rank_restart_grace_ms)
        _restart.check_job_id(grace, job_id, process_group)
        # Node loss and arrival: min_nodes > 0 likewise (a trainer of a
        # returning node names the job it joins).
        wanted_min_nodes = _restart.requested_min_nodes(min_nodes)
        _restart.check_job_id(wanted_min_nodes, job_id, process_group, what="min_nodes")
        # What a re-attach after unpickling needs (see __setstate__).
        self._attach_options = dict(
            rank_restart_grace_ms=rank_restart_grace_ms,
            min_nodes=min_nodes,
            divide_by_initial_world_size=bool(divide_by_initial_world_size),
            socket=socket,
            job_id=job_id,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=local_world_size,
            node_rank=node_rank,
            coordinator=coordinator,
            first_bucket_cap_mb=first_bucket_cap_mb,
            broadcast_chunk_mb=broadcast_chunk_mb,
            init_sync=bool(init_sync),
            connect_timeout=connect_timeout,
            attach_timeout=attach_timeout,
            wait_timeout=wait_timeout,
        )

        # -- who we are (gradd/_world.py): torch's process group when there
        # is one, else the launcher's environment; the job id is agreed here.
        world = _world.resolve(process_group, device=self._device, **{
            k: self._attach_options[k]
            for k in ("socket", "job_id", "rank", "world_size", "local_rank",
                      "local_world_size", "node_rank", "coordinator")
        })
        self._attach(world)
        if static_graph:
            self._set_static_graph()

    def _attach(self, world: "_world.World") -> None:
        """Attaches to the daemon as `world` says, broadcasts rank 0's state
        and installs the gradient views and hooks (construction, and the
        first forward of an unpickled copy)."""
        opts = self._attach_options
        self.process_group = world.group
        self._is_subgroup = world.is_subgroup
        self.rank = world.rank
        self.world_size = world.world_size
        self.local_rank = world.local_rank
        self.local_world_size = world.local_world_size
        self.node_rank = world.node_rank
        self.num_nodes = world.num_nodes
        self.job_id = world.job_id
        self._coordinator = world.coordinator
        self._ranks_are_group_ranks = world.ranks_are_group_ranks
        named = list(zip(self._param_names, self._params))
        cuda = self._device.type == "cuda"
        # (name, shape, dtype), plus the device for CUDA modules.
        specs = [
            (n, tuple(p.shape), _DTYPES[p.dtype]) + (("cuda",) if cuda else ())
            for n, p in named
        ]
        state = _state_sync.module_states(self.module)
        state_bytes = _state_sync.state_bytes(state)
        self._bcast_bytes = 0
        if self.world_size > 1:
            self._bcast_bytes = int(
                max(4096, min(state_bytes, opts["broadcast_chunk_mb"] * _MiB))
            )
        multi = self.num_nodes > 1
        self._client = _C.attach(
            specs,
            socket=opts["socket"] or "",
            job_id=self.job_id,
            local_rank=self.local_rank,
            local_world_size=self.local_world_size,
            bucket_cap_mb=float(self.bucket_cap_mb),
            first_bucket_cap_mb=float(opts["first_bucket_cap_mb"] or 0.0),
            broadcast_bytes=self._bcast_bytes,
            connect_timeout=opts["connect_timeout"],
            attach_timeout=opts["attach_timeout"],
            wait_timeout=opts["wait_timeout"],
            node_rank=self.node_rank if multi else None,
            num_nodes=self.num_nodes,
            coordinator=world.coordinator if multi else "",
            world_size=self.world_size,
            rank=self.rank,
            # Always: the used map also serves static_graph, which
            # _set_static_graph() may turn on after construction.
            find_unused_parameters=True,
            cuda_device=self.device_ids[0] if cuda else -1,
            rank_restart_grace_ms=opts.get("rank_restart_grace_ms"),
            min_nodes=opts.get("min_nodes"),
            divide_by_initial_world_size=bool(opts.get("divide_by_initial_world_size")),
        )
        if self._client.world_size != self.world_size or self._client.global_rank != self.rank:
            got = (self._client.global_rank, self._client.world_size)
            self._client.detach()
            self._client = None
            source = "the process group" if world.group is not None else "the environment"
            raise GraddError(
                f"job '{self.job_id}': the daemon placed this trainer at rank {got[0]} of "
                f"{got[1]}, but {source} says rank {self.rank} of {self.world_size}"
            )

        # -- rank restart (gradd/_restart.py) -------------------------------
        explicit_id = bool(opts.get("job_id") or os.environ.get(_restart.JOB_ENV))
        self._restart = _restart.RestartState(self._client, explicit_id)
        if self._restart.grace_ms > 0 or self._restart.min_nodes > 0:
            # A rebuild is a job-wide switch a restarted rank (or a node that
            # comes back) cannot know it missed: elastic jobs keep their
            # first plan.
            self._rebuild_buckets_enabled = False

        # -- every rank starts from rank 0's state -------------------------
        # (not a restarted rank: the survivors are not in this broadcast; it
        # gets the job's state at its first forward's state sync)
        # init_sync=False (torch 2.7's): the user made the ranks equal.
        if self.world_size > 1 and not self._restart.rejoined and opts.get("init_sync", True):
            if not _torch_compat.init_syncs_buffers(self.broadcast_buffers):
                # torch 2.x with broadcast_buffers=False: parameters only.
                state = _state_sync.module_states(self.module, buffers=False)
            self._broadcast_tensors(state)

        # -- gradient views and autograd hooks -----------------------------
        # .grad is left alone here (None stays None, as in torch): a view is
        # handed out when the parameter gets a gradient or the average.
        views: List[torch.Tensor] = []
        for i, p in enumerate(self._params):
            if cuda:
                views.append(_cuda.gradient_view(self._client, i, p))
                continue
            view = torch.from_numpy(self._client.gradient(i))
            if p.dtype == torch.bfloat16:
                view = view.view(torch.bfloat16)
            views.append(view.view(p.shape))
        self._reducer = Reducer(
            self._client,
            self._params,
            self._param_names,
            views,
            find_unused_parameters=self.find_unused_parameters,
            who=f"job '{self.job_id}', rank {self.rank}",
            fail=self._fail,
            done=self._backward_done,
            device=self._device,
            sparse=SparseReducer(
                list(self._sparse_names),
                list(self._sparse_params),
                self.rank,
                self.world_size,
                lambda buf, root: self._broadcast_tensors([buf], root),
            ),
        )
        if self.static_graph:  # re-attached after unpickling
            self._reducer.static_graph = True
        self._reducer.abort_quietly = bool(self.__dict__.get("_abort_quietly", False))
        self._needs_attach = False

    # ------------------------------------------------------------- pickling
    # As torch 1.13's DDP (__getstate__ / __setstate__): the module, its
    # parameters and the constructor's settings travel; the connection to
    # the daemon (torch: the reducer and process group) does not. torch
    # refuses to pickle a DDP over a non-default process group, and so does
    # gradd (a subgroup's members are not known again on load). A DDP built
    # from the launcher's environment alone (no process group) pickles too.
    #
    # Loading does not talk to anyone: attaching is collective (every rank of
    # the job must do it), and a rank that only loads a checkpoint to look at
    # it must not block. The loaded copy attaches at its first forward, as a
    # new job (a fresh agreed id, or the n-th model of an explicit one) of the
    # default process group's ranks -- or the environment's world -- at that
    # time; every rank must then run that forward, as torch's ranks must all
    # rebuild their reducers. Comm hooks, like torch's, are not kept.
    # Registered states (register_state) are not kept either: they name
    # live objects (an optimizer) of this process.
    _NOT_PICKLED = (
        "_client", "_reducer", "process_group", "_failure", "_gradd_comm_hook", "_restart",
        "_comm_hooks", "_in_backward_params",
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
        attrs = dict(self.__dict__)
        for key in self._NOT_PICKLED:
            attrs.pop(key, None)
        return attrs

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("require_forward_param_sync", True)
        self.__dict__.setdefault("require_backward_grad_sync", True)
        self.__dict__["_comm_hooks"] = []  # comm hooks are not kept, as torch's
        self.__dict__["_lazy_init_ran"] = False
        self.__dict__["_in_backward_params"] = []
        self._client = None
        self._reducer = None
        self._failure = None
        self._logged_error = None
        self.process_group = _world.default_group()
        self._has_rebuilt_buckets = False
        self._needs_attach = True

    def _attach_again(self) -> None:
        """The first forward of an unpickled copy: a new job (see above)."""
        opts = self._attach_options
        world = _world.resolve(None, device=self._device, **{
            k: opts[k]
            for k in ("socket", "rank", "world_size", "local_rank", "local_world_size",
                      "node_rank", "coordinator", "job_id")
        })
        self._attach(world)

    # --------------------------------------------------------- rank restart
    def register_state(self, state_dict_fn, load_state_dict_fn) -> None:
        """Registers state that a restarted rank must get from the others
        at its state sync, besides parameters and buffers: the root sends
        ``torch.save(state_dict_fn())``, a rank that rejoined calls
        ``load_state_dict_fn(torch.load(...))``. Any number, applied in
        registration order; every rank must register the same ones in the
        same order (e.g. ``optimizer.state_dict, optimizer.load_state_dict``,
        an LR scheduler's, a step counter's)."""
        _restart.register_state(self, state_dict_fn, load_state_dict_fn)

    def sync_state(self) -> bool:
        """Runs the rank restart state sync now if one is due (it runs at
        the start of forward anyway). Call it at the top of the training
        loop when the batch depends on registered state (the step): a
        restarted rank then picks the job's batch. Returns whether it ran;
        collective when due (every rank is at the same point)."""
        self._raise_if_failed()
        return _restart.sync_state(self)

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

    @property
    def rejoined(self) -> bool:
        """True when this process re-attached to its running job after a
        restart (rank_restart_grace_ms > 0)."""
        restart = self.__dict__.get("_restart")
        return bool(restart is not None and restart.rejoined)

    @property
    def rejoin_iteration(self) -> Optional[int]:
        """The job's iteration this rank goes on at after rejoining (its
        first), None when it did not rejoin. A restarted rank, or a trainer
        of a node admitted into its running job: the iteration every node's
        daemon numbers the same ("re-formed ... goes on at iteration N" in
        their logs, `graddctl job`), counted from 1 when the job formed."""
        restart = self.__dict__.get("_restart")
        return restart.rejoin_iteration if restart is not None else None

    @property
    def iterations_aborted(self) -> int:
        """Iterations aborted by rank restarts since this rank attached."""
        client = self.__dict__.get("_client")
        return int(client.iterations_aborted) if client is not None else 0

    @property
    def min_nodes(self) -> int:
        """The job's min_nodes as the daemon answered (0: a lost node fails
        the job)."""
        restart = self.__dict__.get("_restart")
        return restart.min_nodes if restart is not None else 0

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

    @property
    def rank_restart_grace_ms(self) -> int:
        """The grace the job runs with (0: none)."""
        restart = self.__dict__.get("_restart")
        return restart.grace_ms if restart is not None else 0

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
        out = []
        for b in range(self._client.num_buckets):
            info = self._client.bucket(b)
            if not info["params"]:
                continue
            info["param_names"] = [self._param_names[i] for i in info["params"]]
            out.append(info)
        return out

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
        if sample_rate < 1:
            self._log_and_throw(
                ValueError,
                "DDP runtime logging sample rate should be equal or greater than 1",
            )
        self._logging_sample_rate = int(sample_rate)

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module, params_and_buffers_to_ignore):
        """torch's: names ('<module>.<param>') DDP leaves alone, set on the
        module before wrapping it."""
        module._ddp_params_and_buffers_to_ignore = params_and_buffers_to_ignore

    def _build_params_for_reducer(self):
        """torch's: (the parameters DDP reduces, in registration order, and
        whether each expects a sparse gradient)."""
        params = list(self._params) + list(self._sparse_params)
        sparse = [False] * len(self._params) + [True] * len(self._sparse_params)
        by_id = {id(p): i for i, (_, p) in enumerate(self.module.named_parameters())}
        order = sorted(range(len(params)), key=lambda i: by_id.get(id(params[i]), i))
        return [params[i] for i in order], [sparse[i] for i in order]

    def _build_debug_param_to_name_mapping(self, parameters) -> dict:
        """torch's: {index in `parameters`: fully qualified name}, checking
        (with torch's messages) that `parameters` are exactly the ones DDP
        reduces."""
        index = {id(p): i for i, p in enumerate(parameters)}
        out = {}
        for name, p in list(zip(self._param_names, self._params)) + list(
            zip(self._sparse_names, self._sparse_params)
        ):
            if id(p) not in index:
                self._log_and_throw(
                    ValueError,
                    f"Param with name {name} found in module parameters, but not DDP "
                    "parameters.",
                )
            out[index[id(p)]] = name
        if len(out) != len(parameters):
            self._log_and_throw(
                ValueError,
                "Expected param to name mapping to cover all parameters, but got "
                f"conflicting lengths: {len(out)} vs {len(parameters)}.",
            )
        return out

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
        from gradd import _ddp_logging

        return _ddp_logging.logging_data(self)

    # --------------------------------------------------------------- forward
    def forward(self, *inputs, **kwargs):
        self._raise_if_failed()
        # Before anything collective: every rank of a job refuses alike.
        _torch_compat.refuse_compiled_autograd("forward")
        if self._client is None and self.__dict__.get("_needs_attach"):
            self._attach_again()  # an unpickled copy: see __setstate__
        if self._client is None:
            raise RuntimeError(
                f"gradd.torch.DistributedDataParallel (job '{self.job_id}', rank "
                f"{self.rank}) was shut down; use .module to run the model locally"
            )
        # Rank restart: the state sync, before anything else collective.
        _restart.sync_state(self)
        grad_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if grad_sync:
            if self._reducer.backward_in_progress:
                self._fail(
                    RuntimeError(
                        "Expected to have finished reduction in the prior iteration before "
                        "starting a new one: the previous backward() did not complete "
                        f"(job '{self.job_id}', rank {self.rank})"
                    )
                )
            _ddp_logging.sample_runtime_stats(self)
            self.num_iterations += 1
        # Where torch's forward calls reducer._rebuild_buckets(): any
        # grad-enabled forward, between iterations.
        if torch.is_grad_enabled() and not self._reducer.backward_in_progress:
            if _rebuild.maybe_rebuild(self):
                self._has_rebuilt_buckets = True
        if self._join_config.enable:
            # Join mode (gradd/_join.py): tell the daemon this rank takes part;
            # buffers come from the highest active rank instead of rank 0.
            _join.on_forward(self, grad_sync)
        elif self.require_forward_param_sync and self.broadcast_buffers and self.world_size > 1:
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
        if grad_sync:
            self.require_forward_param_sync = True
            self._reducer.prepare_for_backward(t0)
            output = self._reducer.wrap_output(output)
        else:
            self.require_forward_param_sync = False
        return output

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, forward+backward accumulate gradients locally without
        talking to the daemon; the first synced backward after it averages
        the accumulated gradients."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # ------------------------------------------------------- not supported
    def register_comm_hook(self, state, hook):
        """Any hook torch accepts: torch's allreduce, fp16/bf16 and PowerSGD
        hooks run in the daemon, every other one in this process, over the
        job's gradd group when its state means the DDP's ranks, else over the
        group its state names (see gradd/_comm_hooks.py, _hook_group.py)."""
        from gradd import _comm_hooks

        _comm_hooks.register_comm_hook(self, state, hook)
        self.__dict__.setdefault("_comm_hooks", []).append((hook, state))  # torch 2.x's record

    def _register_builtin_comm_hook(self, comm_hook_type):
        from gradd import _comm_hooks

        _comm_hooks.register_builtin_comm_hook(self, comm_hook_type)

    def _register_fused_optim(self, optim, *args, optim_params=None, **kwargs):
        """torch's optimizer overlap: the optimizer steps each bucket's
        parameters as soon as its allreduce is done. What torch's
        ``_OverlappedStandardOptimizer.register_ddp`` registers (torch's
        ``_hook_then_optimizer`` over ``allreduce_hook``, with the
        functional counterpart of `optim`), so it runs in the trainer;
        built here because torch 1.13's own path imports FSDP, which fails
        on Python 3.11."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.distributed.algorithms.ddp_comm_hooks.optimizer_overlap_hooks import (
            _hook_then_optimizer,
            _OptimizerHookState,
        )
        from torch.distributed.optim import as_functional_optim

        functional = as_functional_optim(optim, *args, **kwargs)
        state = _OptimizerHookState(functional, optim_params)
        self.register_comm_hook(None, _hook_then_optimizer(default_hooks.allreduce_hook, state))

    # ------------------------------------------------------------- join
    # Uneven inputs: the daemon fills in for ranks that ran out of inputs
    # (no shadow collectives here); see gradd/_join.py. With a hook that runs
    # in the trainer, the trainers shadow it as torch does (_trainer_join.py).
    def join(
        self,
        divide_by_initial_world_size: bool = True,
        enable: bool = True,
        throw_on_early_termination: bool = False,
    ):
        # CUDA modules too: the daemon stages join iterations' buckets
        # through host memory (server/engine/reduce/host_staging.h).
        return _join.GraddJoin(
            [self],
            enable,
            throw_on_early_termination,
            divide_by_initial_world_size=divide_by_initial_world_size,
        )

    def join_hook(self, **kwargs):
        return _join.GraddJoinHook(
            self, kwargs.get("divide_by_initial_world_size", True)
        )

    @property
    def join_device(self):
        return self._device

    @property
    def join_process_group(self):
        return _join.join_process_group(self)

    def _set_static_graph(self):
        """As torch: call it right after construction, before training."""
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.")
            return
        reducer = self._reducer  # None in an unpickled copy before its first forward
        if reducer is not None and (reducer.iterations_done > 0 or reducer.backward_in_progress):
            self._log_and_throw(
                RuntimeError,
                "set_static_graph() should be called before training loop starts and "
                f"after DistributedDataParallel is constructed (job '{self.job_id}', rank "
                f"{self.rank})",
            )
        self.static_graph = True
        if reducer is not None:
            reducer.static_graph = True
        if self.find_unused_parameters:
            warnings.warn(
                "You passed find_unused_parameters=true to DistributedDataParallel, "
                "`_set_static_graph` will detect unused parameters automatically, so "
                "you do not need to set find_unused_parameters=true, just be sure these "
                "unused parameters will not change during training loop while calling "
                "`_set_static_graph`."
            )

    # ------------------------------------------------ torch 2.x's internals
    # What user code and torch itself touch on a torch 2.x DDP. gradd has
    # no c10d ``reducer`` (``ddp.reducer`` is deliberately absent: code that
    # drives torch's Reducer directly cannot drive gradd's daemon; gradd's
    # own is ``_reducer``), no mixed precision and no delayed all-reduce.
    @classmethod
    def _get_active_ddp_module(cls):
        """torch's: the DDP (torch's or gradd's) whose module is running,
        for dynamo's DDPOptimizer."""
        return getattr(torch.nn.parallel.DistributedDataParallel, "_active_ddp_module", None)

    @staticmethod
    def _get_data_parallel_params(module, named_params=False):
        """torch's: the parameters a DDP manages (not ``_ddp_ignored``)."""
        for param in module.parameters() if not named_params else module.named_parameters():
            if not hasattr(param, "_ddp_ignored"):
                yield param

    def will_sync_module_buffers(self) -> bool:
        """torch's: whether the next forward broadcasts the buffers."""
        return bool(
            self.require_forward_param_sync
            and self.broadcast_buffers
            and _state_sync.module_buffers(self.module)
        )

    def _set_ddp_sink_clone(self, val: bool) -> None:
        """torch 2.x's switch; gradd's sink always clones the outputs
        (in-place changes of the loss stay allowed), so only recorded."""
        self._ddp_sink_clone = bool(val)

    def _check_reducer_finalized(self) -> None:
        """torch's: raises when a synced backward is still in progress."""
        reducer = self.__dict__.get("_reducer")
        if reducer is not None and reducer.backward_in_progress:
            self._log_and_throw(
                RuntimeError,
                "Expected to have finished reduction in the prior iteration before "
                f"starting a new one (gradd job '{self.job_id}', rank {self.rank})",
            )

    def _update_process_group(self, new_process_group):
        """torch 2.x's; gradd re-forms a job's network itself (min_nodes)."""
        raise NotImplementedError(
            "gradd.torch.DistributedDataParallel does not support _update_process_group(); "
            "a gradd job re-forms after a node loss by itself (min_nodes=, see "
            "docs/operations.md)"
        )

    # ---------------------------------------------------------------- close
    def shutdown(self) -> None:
        """Detaches from the daemon. Gradients stay readable (the memory stays
        mapped while views exist) but are no longer averaged."""
        client, self._client = self.__dict__.get("_client"), None
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
            _restart.on_aborted(self, error)
        if self._failure is None:
            self._failure = error
        if self._logged_error is None:
            self._logged_error = f"{type(error)}: {error}"
        raise error

    def _backward_done(self) -> None:
        """A synced backward completed (the reducer's end): commit again;
        the optimizers in backward step on the averaged gradients."""
        _restart.on_backward_done(self)
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
        self._logged_error = f"{err_type}: {err_msg}"
        raise err_type(err_msg)

    def _raise_if_failed(self):
        if self._failure is not None:
            raise RuntimeError(
                f"gradd job '{self.job_id}' (rank {self.rank}) failed earlier: {self._failure}"
            ) from self._failure


# The rank restart pattern inside the optimizer (after the class it checks for).
from gradd._optim import OptimizerWrapper  # noqa: E402
